// qwen3_moe as a registered Architecture (model/architecture.h).
#pragma once

#include "model/architecture.h"

namespace moetier::qwen3_moe {

const Architecture& architecture();

}  // namespace moetier::qwen3_moe
