// kvq command-line entry point: registers the subcommands, runs the chosen one, and turns every error into
// one line on stderr with a non-zero exit status.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/blas_core.h"
#include "common/error.h"
#include "common/version.h"

int main(int argc, char** argv) {
  kvq::reexec_for_blas_core(argv);  // OpenBLAS on CPUs newer than its table (common/blas_core.h)
  CLI::App app{"kvq — long-context LLM inference on 2-bit KV caches"};
  app.set_version_flag("--version", std::string(KVQ_VERSION) + " (" + kvq::git_describe() + ")");
  app.require_subcommand(1);
  kvq::cli::add_run(app);
  kvq::cli::add_ppl(app);
  kvq::cli::add_info(app);
  kvq::cli::add_bench(app);
  kvq::cli::add_calibrate(app);
  kvq::cli::add_eval(app);
  kvq::cli::add_referee(app);
  kvq::cli::add_serve(app);
  std::vector<std::string> args = kvq::cli::expand_aliases(argc, argv);
  std::string commands;
  for (const CLI::App* sub : app.get_subcommands({})) commands += (commands.empty() ? "" : ", ") + sub->get_name();
  if (args.empty()) {
    std::fprintf(stderr, "kvq: error: no command given (usage: kvq COMMAND [options]; commands: %s)\n",
                 commands.c_str());
    return 2;
  }
  const std::string& first = args.front();
  const bool is_global = first == "-h" || first == "--help" || first == "--help-all" || first == "--version";
  if (!is_global && app.get_subcommands([&](CLI::App* sub) { return sub->get_name() == first; }).empty()) {
    std::fprintf(stderr, "kvq: error: unknown command '%s' (commands: %s)\n", first.c_str(), commands.c_str());
    return 2;
  }
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
