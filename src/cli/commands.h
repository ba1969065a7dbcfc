// Each kvq subcommand registers itself on the root app; its callback runs when the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

namespace kvq::cli {

void add_run(CLI::App& app);
void add_ppl(CLI::App& app);
void add_info(CLI::App& app);
void add_bench(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_eval(CLI::App& app);
void add_referee(CLI::App& app);
void add_serve(CLI::App& app);

}  // namespace kvq::cli
