// Pins the exact f32 activations for MXFP4 matmuls (kernels/cpu/dispatch.h)
// in every test of the executable that includes this header: the golden
// tests compare with transformers' float32 logits within 1e-4, which the q8
// default (int8 activations) does not meet. Header-only: one per executable.
#pragma once

#include <gtest/gtest.h>

#include "kernels/cpu/dispatch.h"

namespace moetier::testing {

struct ExactActivations : ::testing::Environment {
  void SetUp() override { cpu::set_mxfp4_activations(cpu::Activations::F32); }
};

namespace {
[[maybe_unused]] const auto* const kExactActivations =
    ::testing::AddGlobalTestEnvironment(new ExactActivations);
}  // namespace

}  // namespace moetier::testing
