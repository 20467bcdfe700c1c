#!/bin/sh
# Train moekit's default model in the background and commit the result (issue 10).
#   nohup scripts/train_and_commit.sh [train_tiny_moe.py flags...] > /tmp/train.log 2>&1 &
# Training runs at nice $MOEKIT_TRAIN_NICE (default 5: the 2-core machine is shared with compiler jobs).
# Commits ONLY models/moekit-tiny-moe/ (pathspec commit: other people's staged changes stay staged),
# retrying while another git process holds .git/index.lock.
set -u
cd "$(dirname "$0")/.." || exit 1
nice -n "${MOEKIT_TRAIN_NICE:-5}" python3 scripts/train_tiny_moe.py "$@"
status=$?
if [ "$status" -ne 0 ]; then
    echo "train_and_commit: training failed with status $status; the resumable state and the best weights so far are in build/tiny-moe-train (state.pt, best_model.pt; resume with --resume); nothing committed" >&2
    exit "$status"
fi
size=$(du -sb models/moekit-tiny-moe | cut -f1)
if [ "$size" -gt 62914560 ]; then
    echo "train_and_commit: models/moekit-tiny-moe is $size bytes (> 60 MiB); not committing" >&2
    exit 1
fi
msg="models/moekit-tiny-moe: trained tiny Mixtral MoE on WikiText-2 (scripts/train_tiny_moe.py)"
i=0
while [ $i -lt 120 ]; do
    if [ ! -e .git/index.lock ] && git add models/moekit-tiny-moe && git commit -m "$msg" -- models/moekit-tiny-moe; then
        echo "train_and_commit: committed"
        exit 0
    fi
    i=$((i + 1))
    sleep 5
done
echo "train_and_commit: could not commit after 120 attempts" >&2
exit 1
