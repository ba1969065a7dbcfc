// Where this kvq was built from: `git describe --always --dirty` of the source tree when CMake configured it
// ("unknown" outside a git checkout). It lives in one generated source file, so a new commit recompiles that file
// only. The release version is the KVQ_VERSION macro (CMakeLists.txt's project version).
#pragma once

namespace kvq {

const char* git_describe();

}  // namespace kvq
