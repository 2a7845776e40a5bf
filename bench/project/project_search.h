// strata-project search: the projection's search over training configurations (project/search.h) as a subcommand.
#pragma once

namespace strata {

// `strata-project search ...` with argv[0] = "search". Returns the exit code; bad input throws UsageError.
int project_search(int argc, char** argv);

}  // namespace strata
