# Sourced by the test scripts that start a runtime: sets and exports CHI_PORT to a port below
# the ephemeral ones, claimed as tests/test_ports.h claims its blocks: the first free one from
# 30000 + $$ % 2768, held with an flock for as long as the script (and the runtime it
# starts, which inherits the descriptor) runs.
for ((k = 0; k < 2768; ++k)); do
  CHI_PORT=$((30000 + ($$ + k) % 2768))
  exec {port_lock}>"/tmp/chi_test_ports_$(id -u)_${CHI_PORT}.lock"
  flock -n "$port_lock" && break
  exec {port_lock}>&-
done
export CHI_PORT
