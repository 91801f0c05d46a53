#!/usr/bin/env bash
# Held-out perplexity of the embedded model under residency budgets, every miss policy preset
# and eviction rule (docs/quality.md "Expert misses"). For each run pw-eval emulates the budget
# (exact outputs, fetch time idealised) and records the emulated run's router-logit trace;
# pw-sim replays that trace under the same policy for the modelled time per token, so quality
# and time come from the same token sequence. Writes OUT/misses.csv and prints it.
#   tools/miss_quality_sweep.sh OUT [TEXT] [RESIDENCIES] [PRESETS] [EVICTIONS]
# The weight-blind control substitutes BLIND[residency] of the non-first misses (default: the
# shares that match rule-0.15's substitution rate on the embedded model, found with pw-sim;
# PW_BLIND="0.25=Q 0.5=Q" gives another model's). PW_MODEL picks the model, PW_SIM_FLAGS adds
# pw-sim's cost constants for it (--base-us U --expert-us U: its own measured step).
set -euo pipefail
declare -A BLIND=([0.25]=0.68 [0.5]=0.76)
for kv in ${PW_BLIND:-}; do BLIND[${kv%%=*}]=${kv#*=}; done
read -r -a sim_flags <<< "${PW_SIM_FLAGS:-}"
out=${1:?usage: miss_quality_sweep.sh OUT [TEXT] [RESIDENCIES] [PRESETS] [EVICTIONS]}
text=${2:-build/eval/heldout.txt}
residencies=${3:-"0.25 0.5"}
presets=${4:-"fetch-every-miss rule-0.15 first-choice weight-blind quality-first speed-first"}
evictions=${5:-"lfu lru score-ema"}
bin=${PW_BIN:-build/bin}
model=${PW_MODEL:-models/tiny-moe}
mkdir -p "$out"
csv="$out/misses.csv"
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }

"$bin/pw-eval" ppl --model "$model" --text "$text" --ctx 256 --threads 2 \
  --record-trace "$out/all-resident.trace" > "$out/all-resident.txt" 2> /dev/null
base=$(val ppl "$out/all-resident.txt")
echo "residency,preset,eviction,ppl,ppl_change_pct,mass_mean,substitution_rate,first_choice_substitutions,fetches_per_token,admissions_per_token,sim_us_per_token,sim_fetches_per_token,sim_us_all_resident" > "$csv"
echo "1,all-resident,-,$base,0,0,0,0,0,0,,," >> "$csv"
for r in $residencies; do
  for p in $presets; do
    for e in $evictions; do
      run="$out/run.txt"
      flags=(--residency "$r" --miss-policy "$p" --miss-eviction "$e")
      if [ "$p" = weight-blind ]; then flags+=(--miss-blind-fraction "${BLIND[$r]:-0.5}"); fi
      "$bin/pw-eval" ppl --model "$model" --text "$text" --ctx 256 --threads 2 "${flags[@]}" \
        --record-trace "$out/run.trace" > "$run" 2> /dev/null
      "$bin/pw-sim" --trace "$out/run.trace" "${flags[@]}" "${sim_flags[@]}" > "$out/sim.txt" 2> /dev/null
      ppl=$(val ppl "$run")
      fc=$(val misses_first_choice_substitutions "$run")
      echo "$r,$p,$e,$ppl,$(python3 -c "print(f'{($ppl/$base-1)*100:.3f}')"),$(val misses_mass_mean "$run"),$(val misses_substitution_rate "$run"),$fc,$(val misses_fetches_per_token "$run"),$(val misses_admissions_per_token "$run"),$(val us_per_token "$out/sim.txt"),$(val fetches_per_token "$out/sim.txt"),$(val us_per_token_all_resident "$out/sim.txt")" >> "$csv"
      tail -1 "$csv"
    done
  done
done
rm -f "$out/run.trace"
