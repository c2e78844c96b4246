// `pipetrain launch`: the local launcher as a (hidden) subcommand, and the glue for
// `pipetrain train --nproc N` (train.cpp calls pipetrain::launch_self, runtime/launcher.h).
//
//   pipetrain launch --nproc 4 [--grace 10] [--master-port P] -- train --stages 4 ...
// runs `pipetrain train --stages 4 ...` as ranks 0..3 of one job on this machine (torchrun's
// environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), prefixes their output
// with "[rank r] ", and exits with the first failing rank's code.
#include <chrono>

#include "commands.h"
#include "pipetrain/runtime/launcher.h"

namespace pipetrain::cli {

void add_launch_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("launch", "run a pipetrain command as N local ranks");
  command->group("");  // hidden: `pipetrain train --nproc N` is the documented entry
  auto nproc = std::make_shared<int>(1);
  auto grace = std::make_shared<double>(10.0);
  auto port = std::make_shared<int>(0);
  command->add_option("--nproc", *nproc, "ranks to start")->required()->check(CLI::PositiveNumber);
  command->add_option("--grace", *grace, "seconds the others get after a rank fails");
  command->add_option("--master-port", *port, "rendezvous port (default: a free one)");
  auto positional = std::make_shared<std::vector<std::string>>();
  command->add_option("command", *positional, "the pipetrain command and its arguments");
  command->prefix_command();  // everything after the command belongs to it
  command->callback([command, positional, nproc, grace, port, &exit_code] {
    // Without `--` CLI11 gives the command's bare words to `positional` and its flags to
    // remaining(), and their order is lost: the ranks got `--model --data mlp ...`.
    // With `--` every word after it is in `positional` (remaining() holds the `--`).
    for (const std::string& rest : command->remaining()) {
      if (rest != "--") {
        throw UsageError("launch: put -- before the command, e.g. launch --nproc " +
                         std::to_string(*nproc) + " -- train ...");
      }
    }
    std::vector<std::string> args = *positional;
    if (args.empty()) throw UsageError("launch: give the command to run, e.g. -- train ...");
    LaunchOptions options;
    options.program = self_executable();
    options.args = args;
    options.nproc = *nproc;
    options.master_port = *port;
    options.store_socket = true;  // the ranks are this program
    if (!(*grace >= 0 && *grace <= 1e6)) {
      throw UsageError("launch: --grace must be 0 to 1e6 seconds, got " + c10::str(*grace));
    }
    options.grace = std::chrono::milliseconds(static_cast<int64_t>(*grace * 1000));
    exit_code = launch_local(options).exit_code;
  });
}

}  // namespace pipetrain::cli
