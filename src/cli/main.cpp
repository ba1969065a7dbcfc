// kvq command-line entry point: parses the subcommand, runs it, turns every kvq::Error into one line.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kvq — long-context LLM inference on 2-bit KV caches"};
  app.set_version_flag("--version", std::string(KVQ_VERSION) + " (" KVQ_GIT ")");
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.what());
    return 2;
  } catch (const kvq::Error& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.message().c_str());
    return 1;
  }
  return 0;
}
