// Durability before publication: a writer that renames a finished file or folder into place
// syncs its contents first and the folder holding the new name after, so a power loss
// leaves either the old state or the whole new one, never a name pointing at unwritten data.
#pragma once

#include <filesystem>

#include "base/status.h"

namespace peerserve {

// fsync of one regular file or folder (a folder's entries: renames into it, files made in it).
Status sync_path(const std::filesystem::path& path);

// fsync of every regular file under `dir` (at most 64 folders deep), of every folder below it,
// and of `dir` itself.
Status sync_tree(const std::filesystem::path& dir);

}  // namespace peerserve
