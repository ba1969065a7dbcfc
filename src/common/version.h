// Where this kvq was built from: `git describe --always --dirty` of the source tree at the last build
// ("unknown" outside a git checkout). It lives in one generated source file (cmake/git_version.cmake rewrites it only
// when the description changes), so a new commit recompiles that file only. The release version is the KVQ_VERSION
// macro (CMakeLists.txt's project version).
#pragma once

namespace kvq {

const char* git_describe();

}  // namespace kvq
