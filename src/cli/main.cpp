// kvq command-line entry point: registers the subcommands, runs the chosen one, and turns every error into
// one line on stderr with a non-zero exit status.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kvq — long-context LLM inference on 2-bit KV caches"};
  app.set_version_flag("--version", std::string(KVQ_VERSION) + " (" KVQ_GIT ")");
  app.require_subcommand(1);
  kvq::cli::add_run(app);
  kvq::cli::add_ppl(app);
  kvq::cli::add_info(app);
  kvq::cli::add_bench(app);
  kvq::cli::add_eval(app);
  std::vector<std::string> args = kvq::cli::expand_aliases(argc, argv);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(args);
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
