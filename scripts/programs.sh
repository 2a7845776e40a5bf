# Sourced by the launch scripts: the suite runs of bench/programs.txt.
#   strata_suite_runs ROOT cpu|gpu [NP] [all|once|repeated]
#                                         prints "name<TAB>arguments" for each suite run of that kind; runs marked
#                                         "even:" (two pipeline stages) only when NP is even or not given; "repeated":
#                                         only the runs marked "repeat:" (make run repeats them in passes), "once":
#                                         only the others; "all" (the default): every run, each once
#   strata_suite_programs ROOT       prints the names of the programs that have suite runs
#   strata_args_variable NAME        the environment variable that replaces NAME's runs (strata-gemm -> STRATA_GEMM_ARGS)

strata_trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }

strata_suite_runs() {
  local root=$1 kind=$2 np=${3:-} which=${4:-all} name sources report runs run repeat even
  local -a list
  case $which in all | once | repeated) ;; *) echo "strata_suite_runs: unknown selection '$which' (all, once, repeated)" >&2; return 2 ;; esac
  while IFS='|' read -r name sources report runs; do
    name=$(strata_trim "$name")
    [[ -z $name || $name == \#* ]] && continue
    runs=$(strata_trim "$runs")
    [[ $runs == "-" ]] && continue
    IFS=';' read -r -a list <<<"$runs"
    for run in "${list[@]}"; do
      run=$(strata_trim "$run")
      repeat=0 even=0
      while [[ $run == repeat:* || $run == even:* ]]; do  # the markers, in either order
        if [[ $run == repeat:* ]]; then repeat=1 run=$(strata_trim "${run#repeat:}"); fi
        if [[ $run == even:* ]]; then even=1 run=$(strata_trim "${run#even:}"); fi
      done
      [[ $which == once && $repeat == 1 ]] && continue
      [[ $which == repeated && $repeat == 0 ]] && continue
      [[ $even == 1 && -n $np && $((np % 2)) -ne 0 ]] && continue
      if [[ $run == gpu:* ]]; then
        [ "$kind" = gpu ] && printf '%s\t%s\n' "$name" "$(strata_trim "${run#gpu:}")"
      else
        [ "$kind" = cpu ] && printf '%s\t%s\n' "$name" "$run"
      fi
    done
  done <"$root/bench/programs.txt"
  return 0
}

strata_suite_programs() { strata_suite_runs "$1" cpu | cut -f1 | uniq; }

strata_args_variable() { local n=${1#strata-}; n=${n//-/_}; printf 'STRATA_%s_ARGS' "${n^^}"; }
