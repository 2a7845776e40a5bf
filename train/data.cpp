// Implementation of the token sources (see data.h).
#include "train/data.h"

#include <stdexcept>
#include <string>

namespace strata::train {

namespace {

// SplitMix64: a good 64-bit mix, so neighbouring (step, row, position) give unrelated tokens.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, int64_t step, int64_t row, int64_t position) {
  return mix(mix(mix(seed ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(row)) ^ static_cast<uint64_t>(position));
}

class Synthetic final : public TokenSource {
 public:
  Synthetic(int vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {}
  void rows(int64_t step, int64_t first_row, int rows, int seq, int32_t* tokens, int32_t* targets) const override {
    for (int r = 0; r < rows; ++r)
      for (int t = 0; t <= seq; ++t) {
        const auto token = static_cast<int32_t>(hash(seed_, step, first_row + r, t) % static_cast<uint64_t>(vocab_));
        if (t < seq) tokens[r * seq + t] = token;
        if (t > 0) targets[r * seq + t - 1] = token;
      }
  }
  int vocab() const override { return vocab_; }

 private:
  int vocab_;
  uint64_t seed_;
};

class Repeated final : public TokenSource {
 public:
  Repeated(int vocab, int patterns, int max_seq, uint64_t seed) : vocab_(vocab), seed_(seed) {
    if (patterns < 1) throw std::invalid_argument("the learnable task needs at least one pattern");
    patterns_.resize(static_cast<std::size_t>(patterns), std::vector<int32_t>(static_cast<std::size_t>(max_seq) + 1));
    for (int p = 0; p < patterns; ++p)
      for (int t = 0; t <= max_seq; ++t)
        patterns_[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)] =
            static_cast<int32_t>(hash(seed, -1, p, t) % static_cast<uint64_t>(vocab));
  }
  void rows(int64_t step, int64_t first_row, int rows, int seq, int32_t* tokens, int32_t* targets) const override {
    if (seq + 1 > static_cast<int>(patterns_.front().size()))
      throw std::invalid_argument("the learnable task's patterns are shorter than sequence " + std::to_string(seq));
    for (int r = 0; r < rows; ++r) {
      const auto& p = patterns_[hash(seed_, step, first_row + r, -1) % patterns_.size()];
      for (int t = 0; t < seq; ++t) {
        tokens[r * seq + t] = p[static_cast<std::size_t>(t)];
        targets[r * seq + t] = p[static_cast<std::size_t>(t) + 1];
      }
    }
  }
  int vocab() const override { return vocab_; }

 private:
  int vocab_;
  uint64_t seed_;
  std::vector<std::vector<int32_t>> patterns_;
};

class Stream final : public TokenSource {
 public:
  Stream(std::vector<uint16_t> tokens, int vocab, int64_t global_rows, int seq)
      : tokens_(std::move(tokens)), vocab_(vocab), global_rows_(global_rows), seq_(seq) {
    for (std::size_t i = 0; i < tokens_.size(); ++i)
      if (tokens_[i] >= vocab)
        throw std::invalid_argument("token " + std::to_string(tokens_[i]) + " at position " + std::to_string(i) +
                                    " is beyond the vocabulary (" + std::to_string(vocab) + ")");
    if (tokens_.size() < static_cast<std::size_t>(seq) + 1)
      throw std::invalid_argument("the token stream holds " + std::to_string(tokens_.size()) +
                                  " tokens, fewer than one row of sequence " + std::to_string(seq) + " needs");
  }
  void rows(int64_t step, int64_t first_row, int rows, int seq, int32_t* tokens, int32_t* targets) const override {
    if (seq != seq_) throw std::invalid_argument("the token stream was cut for sequence " + std::to_string(seq_));
    // Rows start seq tokens apart (the target of a row's last token is the next row's first), wrapping.
    const uint64_t rows_in_stream = (tokens_.size() - 1) / static_cast<uint64_t>(seq);
    for (int r = 0; r < rows; ++r) {
      const uint64_t row = (static_cast<uint64_t>(step) * static_cast<uint64_t>(global_rows_) +
                            static_cast<uint64_t>(first_row + r)) % rows_in_stream;
      const uint16_t* at = tokens_.data() + row * static_cast<uint64_t>(seq);
      for (int t = 0; t < seq; ++t) {
        tokens[r * seq + t] = at[t];
        targets[r * seq + t] = at[t + 1];
      }
    }
  }
  int vocab() const override { return vocab_; }

 private:
  std::vector<uint16_t> tokens_;
  int vocab_;
  int64_t global_rows_;
  int seq_;
};

}  // namespace

std::unique_ptr<TokenSource> synthetic_tokens(int vocab, uint64_t seed) {
  if (vocab < 1) throw std::invalid_argument("vocabulary must be positive");
  return std::make_unique<Synthetic>(vocab, seed);
}

std::unique_ptr<TokenSource> repeated_sequences(int vocab, int patterns, int max_seq, uint64_t seed) {
  return std::make_unique<Repeated>(vocab, patterns, max_seq, seed);
}

std::unique_ptr<TokenSource> token_stream(std::vector<uint16_t> tokens, int vocab, int64_t global_rows, int seq) {
  return std::make_unique<Stream>(std::move(tokens), vocab, global_rows, seq);
}

}  // namespace strata::train
