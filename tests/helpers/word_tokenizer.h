// A word-level tokenizer whose ids the tests know: "<bos>" 0, "<eos>" 1, "w0".."w59" 2..61,
// written as DIR/tokenizer.json by the project's Python (the `tokenizers` package), for the tests
// of scripts/prepare-data and of the docs' user path. Stateless.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "python.h"

namespace pipetrain::testing {

// Writes DIR/tokenizer.json; returns whether the Python that writes it succeeded.
inline bool write_word_tokenizer(const std::string& dir) {
  const std::string script = dir + "/make_word_tokenizer.py";
  std::ofstream(script) << R"(
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
words = ["<bos>", "<eos>"] + ["w%d" % i for i in range(60)]
tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<bos>"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.save(sys.argv[1] + "/tokenizer.json")
)";
  return std::system((kPython + " " + script + " " + dir).c_str()) == 0;
}

}  // namespace pipetrain::testing
