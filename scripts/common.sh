# Helpers the GPU scripts share (sourced).

# Waits for the server `$1` (a child of the script) to end, killing it if it has not
# within 20 s: a server that hangs on quit cannot hold up the run.
wait_server() { ( sleep 20; kill -9 "$1" 2>/dev/null ) & local k=$!; wait "$1"; kill "$k" 2>/dev/null; }
