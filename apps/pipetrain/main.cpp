// pipetrain: the command-line front end. Dispatches to the subcommands in commands.h.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>

#include <c10/util/Logging.h>

#include "commands.h"
#include "job_flags.h"
#include "pipetrain/base/error.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/train/config_file.h"

namespace {

int run(int argc, char** argv) {
  // c10's warnings (a TCPStore that lost its peer logs each failed read with a C++ frame list)
  // repeat what pipetrain's own error line says; show them only when asked for with
  // TORCH_CPP_LOG_LEVEL (INFO, WARNING).
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 2;  // ERROR
  CLI::App app{"pipetrain: pipeline-parallel training for LibTorch"};
  app.name("pipetrain");
  app.require_subcommand(1);
  int exit_code = 0;
  pipetrain::cli::add_plan_command(app, exit_code);
  pipetrain::cli::add_train_command(app, exit_code);
  pipetrain::cli::add_bench_command(app, exit_code);
  pipetrain::cli::add_eval_command(app, exit_code);
  pipetrain::cli::add_launch_command(app, exit_code);
  pipetrain::cli::add_generate_command(app, exit_code);
  pipetrain::cli::add_export_hf_command(app, exit_code);
  pipetrain::cli::add_checkpoint_info_command(app, exit_code);
  // CLI11 reads an empty value (--seed '') as 0 or "" without a word, so a quoted unset shell
  // variable trained with --seed 0 or prompted with id 0. Every flag that takes a value refuses
  // one, before any command runs.
  app.parse_complete_callback([&app] {
    for (const CLI::App* command : app.get_subcommands()) {
      for (const CLI::Option* option : command->get_options()) {
        if (!option->nonpositional() || option->get_type_size_max() == 0) continue;  // a flag
        for (const std::string& value : option->results()) {
          if (value.empty()) {
            throw CLI::ValidationError(option->get_name(),
                                       "an empty value (an unset shell variable?); give one");
          }
        }
      }
    }
  });
  try {
    // `--config FILE` of a job command: a TOML file is read into the command's JobConfig before
    // the flags (job_flags.h); a JSON file becomes flags (train/config_file.h). CLI11 takes the
    // arguments reversed.
    std::vector<std::string> arguments(argv + 1, argv + argc);
    arguments = pipetrain::cli::read_config_file(arguments);
    arguments = pipetrain::train::expand_config_arguments(arguments);
    std::reverse(arguments.begin(), arguments.end());
    app.parse(arguments);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and usage
    return 2;
  } catch (const pipetrain::train::ConfigError& e) {
    std::cerr << "pipetrain: error: --config: " << e.what() << "\n";
    return 2;
  } catch (const pipetrain::Error& e) {
    // The one error family (pipetrain/base/error.h): bad input exits 2, a failure while running 1.
    std::cerr << "pipetrain: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "pipetrain: error: " << pipetrain::message_of(e) << "\n";
    return 1;
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  const int code = run(argc, argv);
  // The command's objects are gone by now (files closed, threads joined, process groups shut
  // down); what exit() would still do is tear down LibTorch's static operator registrations: a
  // third of the CPU a short process spends on LibTorch (0.07 of 0.22 s measured), paid again by
  // every rank of every run. Flush and leave without it. Sanitizer builds take the normal exit,
  // so that LeakSanitizer still reports.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  std::_Exit(code);
#endif
  return code;
}
