// strata-project speed: one prediction of each of the largest configurations (1T parameters over 64 pipeline stages
// and 512 micro-batches, on 512 and 10,240 GPUs; 530B on 2,520; 175B on 10,240), timed on this machine and judged
// against kPredictionSecondsTarget (make bench).
#pragma once

namespace strata {

// Seconds of CPU time (one core) one prediction may take: trace, the three simulations and the components.
inline constexpr double kPredictionSecondsTarget = 5.0;

// `strata-project speed ...` with argv[0] = "speed". Returns the exit code (3: a prediction over the target).
int project_speed(int argc, char** argv);

}  // namespace strata
