# Shell functions the soft-RoCE scripts share (sourced, inside the VM).

# Waits until the memory node logging to $1 serves (up to 120 s: a loaded VM can
# take many seconds to start one); otherwise says so and prints its log.
serving() {
    for _ in $(seq 1 240); do
        grep -q "serving" "$1" 2>/dev/null && return 0
        sleep 0.5
    done
    echo "memory node of $1 did not start"
    cat "$1"
}
