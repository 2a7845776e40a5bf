// Where a step's tokens come from. Every source is a function of (step, global row): a data-parallel rank reads
// its rows of the global batch, and any split of the batch over ranks and micro-batches sees the same tokens,
// which is what lets a strategy's step be checked against the single-rank step of the same global batch.
// Targets are the tokens shifted by one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace strata::train {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // tokens and targets (rows, seq) for rows [first_row, first_row + rows) of the global batch at `step`.
  virtual void rows(int64_t step, int64_t first_row, int rows, int seq, int32_t* tokens, int32_t* targets) const = 0;
  virtual int vocab() const = 0;
};

// Uniform random tokens, from a hash of (seed, step, row, position): nothing to learn, the default for timing.
std::unique_ptr<TokenSource> synthetic_tokens(int vocab, uint64_t seed);

// A task a model learns quickly: every row is one of `patterns` fixed random sequences (chosen by a hash of
// step and row), so after its first tokens the rest is determined; the loss falls well below log(vocab).
std::unique_ptr<TokenSource> repeated_sequences(int vocab, int patterns, int max_seq, uint64_t seed);

// A token stream (a text's tokens, e.g. read from an llm.c token file): global batch `global_rows` rows of
// seq + 1 consecutive tokens; step s reads the s-th such block, wrapping around at the end. Throws
// std::invalid_argument when a token is outside the vocabulary (naming its position) or the stream is too short
// for one row.
std::unique_ptr<TokenSource> token_stream(std::vector<uint16_t> tokens, int vocab, int64_t global_rows, int seq);

}  // namespace strata::train
