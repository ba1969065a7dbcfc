# Writes OUT from IN with the source tree's `git describe`, run at every build (not only at configure time) so a
# new commit or an edit shows in `kvq --version` and in every results.json. configure_file rewrites OUT only when
# the description changed, so an unchanged tree recompiles nothing.
execute_process(COMMAND git describe --always --dirty WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE KVQ_GIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT KVQ_GIT)
  set(KVQ_GIT unknown)
endif()
configure_file(${IN} ${OUT} @ONLY)
