// Validation of a checkpoint directory against the architecture it claims.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace moetier {

// Every problem found in DIR, one line each ("FILE: tensor 'NAME': ..." or
// "FILE: field 'NAME': ..."); empty when the checkpoint is valid. Checks
// config.json (architecture and fields), the index and every shard header,
// and that every tensor the architecture needs is present with the shape and
// an allowed dtype that the config implies (experts in any supported layout).
// Never throws on bad input.
std::vector<std::string> check_checkpoint(const std::filesystem::path& dir);

}  // namespace moetier
