// `pipetrain train`: placeholder until its issue lands; it says so and exits 2.
#include <iostream>

#include "commands.h"

namespace pipetrain::cli {

void add_train_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("train", "(not built yet)");
  command->allow_extras();
  command->callback([&exit_code] {
    std::cerr << "pipetrain train: not implemented yet\n";
    exit_code = 2;
  });
}

}  // namespace pipetrain::cli
