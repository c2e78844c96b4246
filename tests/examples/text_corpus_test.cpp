#include "pipetrain/examples/text_corpus.h"

#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::examples {
namespace {

TEST(CharCorpus, VocabularyIsTheSortedDistinctBytes) {
  CharCorpus corpus("banana band", "inline");
  EXPECT_EQ(corpus.vocabulary(), " abdn");
  EXPECT_EQ(corpus.vocab_size(), 5);
}

TEST(CharCorpus, EncodeAndDecodeRoundTrip) {
  CharCorpus corpus("the quick brown fox", "inline");
  torch::Tensor tokens = corpus.encode("quick fox");
  EXPECT_EQ(tokens.scalar_type(), torch::kInt64);
  EXPECT_EQ(corpus.decode(tokens), "quick fox");
  EXPECT_EQ(corpus.decode(corpus.tokens()), corpus.text());
  EXPECT_THROW(corpus.encode("z"), c10::Error);
}

TEST(CharCorpus, UnigramEntropyMatchesHandComputedValues) {
  // Two equally frequent bytes: ln 2. Four bytes with counts 2,1,1 (+0): -(.5 ln .5 + 2 .25 ln
  // .25).
  EXPECT_NEAR(CharCorpus("abab", "x").unigram_entropy(), std::log(2.0), 1e-12);
  EXPECT_NEAR(CharCorpus("aabc", "x").unigram_entropy(),
              -(0.5 * std::log(0.5) + 2 * 0.25 * std::log(0.25)), 1e-12);
}

TEST(CharCorpus, WindowTargetsAreTheNextCharacters) {
  CharCorpus corpus("abcdefghijklmnopqrstuvwxyz", "alphabet");
  TokenWindows windows = corpus.sample_windows(8, 5, 1, 0);
  ASSERT_EQ(windows.inputs.sizes(), torch::IntArrayRef({8, 5}));
  // In the alphabet each next character is the next token.
  EXPECT_TRUE(windows.targets.equal(windows.inputs + 1));
}

TEST(CharCorpus, WindowsArePureFunctionsOfSeedAndStep) {
  std::string text;
  for (int n = 0; n < 1000; ++n) text += std::to_string(n * 7919 % 1000) + " ";
  CharCorpus corpus(text, "numbers");
  TokenWindows a = corpus.sample_windows(4, 16, 7, 3);
  TokenWindows b = corpus.sample_windows(4, 16, 7, 3);
  TokenWindows c = corpus.sample_windows(4, 16, 7, 4);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_FALSE(a.inputs.equal(c.inputs));
}

TEST(CharCorpus, DefaultCorpusIsTheGplText) {
  if (!std::filesystem::exists(kDefaultCorpusPath)) GTEST_SKIP() << "no " << kDefaultCorpusPath;
  CharCorpus corpus = CharCorpus::from_file();
  EXPECT_GT(corpus.text().size(), 30000u);
  EXPECT_NE(corpus.text().find("GNU GENERAL PUBLIC LICENSE"), std::string::npos);
  // English text: the unigram entropy of letters and punctuation is between 2.5 and 3.5 nats.
  EXPECT_GT(corpus.unigram_entropy(), 2.5);
  EXPECT_LT(corpus.unigram_entropy(), 3.5);
  std::printf("%s: %zu bytes, vocabulary %lld, unigram entropy %.4f nats\n",
              corpus.source().c_str(), corpus.text().size(),
              static_cast<long long>(corpus.vocab_size()), corpus.unigram_entropy());
}

TEST(CharCorpus, MissingFileIsADataErrorNamingThePath) {
  try {
    CharCorpus::from_file("/nonexistent/book.txt");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/book.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace pipetrain::examples
