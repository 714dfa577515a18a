#!/bin/sh
# Multi-process tests of braid-train, run by meson (suite 'trainer'):
#
#   trainer_test.sh BRAIDRUN TRAINER equivalence N OPTIMIZER [TRAINER ARGS...]
#       N ranks (through braidrun) and one rank, same global batch, 100 steps:
#       braid-train --compare must find the weights within 1e-5 (relative,
#       see docs/TRAINER.md).
#   trainer_test.sh BRAIDRUN TRAINER equivalence-haswell N OPTIMIZER [TRAINER ARGS...]
#       The same with OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE), whose
#       sgemm rounds a row by where it sits in the product: whatever kernels
#       this machine would pick, the test meets them. Skipped without AVX2/FMA.
#   trainer_test.sh BRAIDRUN TRAINER run N [TRAINER ARGS...]
#       100 steps on N ranks: exit 0 and an accuracy reported.
#   trainer_test.sh BRAIDRUN TRAINER smoke
#       One epoch on 2 ranks: exit 0, an accuracy reported, log and checkpoint written.
#   trainer_test.sh BRAIDRUN TRAINER resume
#       Two epochs in one run end with the same weights as a run stopped after
#       the first epoch and resumed from its checkpoint; a resume with other
#       settings is refused, naming them.
#   trainer_test.sh BRAIDRUN TRAINER bad-data
#       Missing, truncated and corrupt data files: exit 66 and a message naming
#       the file and the fix, never a crash.
#   trainer_test.sh BRAIDRUN TRAINER bad-flags
#       Out-of-range optimizer settings and unwritable output paths: exit 2,
#       naming the flag, before any training.
#
# Exits 77 (meson's "skipped") when the data set is not installed, except
# bad-data and bad-flags, which need none. BRAID_TRAIN_DATA overrides the data directory.
set -eu

braidrun=$1
trainer=$2
mode=$3
shift 3
data=${BRAID_TRAIN_DATA:-/usr/share/datasets/fashion-mnist}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

need_data() {
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
           t10k-labels-idx1-ubyte; do
    if [ ! -r "$data/$f.gz" ] && [ ! -r "$data/$f" ]; then
      echo "SKIP: Fashion-MNIST is not installed ($data/$f.gz is missing);" \
           "apt-get install dataset-fashion-mnist, or set BRAID_TRAIN_DATA"
      exit 77
    fi
  done
}

fail() {
  echo "FAIL: $*"
  exit 1
}

if [ "$mode" = equivalence-haswell ]; then
  for flag in avx2 fma; do
    if ! grep -qw "$flag" /proc/cpuinfo; then
      echo "SKIP: this CPU lacks $flag, which OpenBLAS's Haswell kernels need"
      exit 77
    fi
  done
  export OPENBLAS_CORETYPE=Haswell
  mode=equivalence
fi

case $mode in
equivalence)
  need_data
  ranks=$1
  optimizer=$2
  shift 2
  # 50 is divisible by neither 3 nor 4: ranks get unequal shares.
  set -- --data "$data" --steps 100 --batch 50 --train-samples 5000 --test-samples 1000 \
    --optimizer "$optimizer" --threads 1 --progress none "$@"
  echo "== 1 rank"
  "$trainer" "$@" --save-weights "$work/one.weights"
  echo "== $ranks rank(s)"
  "$braidrun" -n "$ranks" "$trainer" "$@" --save-weights "$work/many.weights"
  echo "== comparison ($ranks rank(s) against 1 rank)"
  "$trainer" --compare "$work/many.weights" --reference "$work/one.weights" --tolerance 1e-5
  ;;

run)
  need_data
  ranks=$1
  shift
  "$braidrun" -n "$ranks" "$trainer" --data "$data" --steps 100 --batch 50 \
    --train-samples 5000 --test-samples 1000 --progress none "$@" >"$work/out.txt" 2>&1 ||
    { cat "$work/out.txt"; fail "braid-train exited non-zero"; }
  cat "$work/out.txt"
  grep -Eq '^\[0\] epoch 1/.*test acc [0-9]+\.[0-9]+%' "$work/out.txt" ||
    fail "no test accuracy reported"
  ;;

smoke)
  need_data
  "$braidrun" -n 2 "$trainer" --data "$data" --epochs 1 --progress lines \
    --log "$work/log.csv" --checkpoint "$work/state.ckpt" --save-weights "$work/final.weights" \
    >"$work/out.txt" 2>&1 || { cat "$work/out.txt"; fail "braid-train exited non-zero"; }
  cat "$work/out.txt"
  grep -Eq '^\[0\] epoch 1/1 .*test acc [0-9]+\.[0-9]+%' "$work/out.txt" ||
    fail "no test accuracy reported"
  [ "$(wc -l <"$work/log.csv")" -eq 2 ] || fail "the CSV log does not have one row"
  [ -s "$work/state.ckpt" ] || fail "no checkpoint written"
  accuracy=$(sed -n 2p "$work/log.csv" | cut -d, -f5)
  echo "test accuracy after 1 epoch: $accuracy"
  awk -v a="$accuracy" 'BEGIN { exit !(a > 0.75) }' || fail "test accuracy $accuracy <= 0.75"
  ;;

resume)
  need_data
  set -- --data "$data" --train-samples 3000 --test-samples 500 --batch 30 --progress none
  "$braidrun" -n 2 "$trainer" "$@" --epochs 2 --save-weights "$work/straight.weights"
  # Interrupted after the first epoch (100 steps), then resumed.
  "$braidrun" -n 2 "$trainer" "$@" --epochs 2 --steps 100 --checkpoint "$work/state.ckpt"
  "$braidrun" -n 2 "$trainer" "$@" --epochs 2 --checkpoint "$work/state.ckpt" --resume \
    --save-weights "$work/resumed.weights" | tee "$work/out.txt"
  grep -q 'resumed from' "$work/out.txt" || fail "the run did not resume"
  "$trainer" --compare "$work/resumed.weights" --reference "$work/straight.weights" \
    --tolerance 0
  # Settings that shape the run, changed at the resume: refused, naming the
  # option with both values, and the checkpoint left as it was.
  expect_refused() {
    # $1: what the message must say; the rest: the changed options
    said=$1
    shift
    before=$(cksum <"$work/state.ckpt")
    status=0
    "$braidrun" -n 2 "$trainer" --data "$data" --train-samples 3000 --test-samples 500 \
      --batch 30 --progress none --epochs 2 --checkpoint "$work/state.ckpt" --resume "$@" \
      >"$work/out.txt" 2>&1 || status=$?
    cat "$work/out.txt"
    [ "$status" -ne 0 ] || fail "a resume with $* was not refused"
    grep -qe "$said" "$work/out.txt" || fail "the refusal does not say '$said'"
    [ "$(cksum <"$work/state.ckpt")" = "$before" ] || fail "a refused resume changed the checkpoint"
  }
  echo "== a changed learning rate"
  expect_refused "--lr 0.002 (the checkpoint's: --lr 0.001)" --lr 0.002
  echo "== a forgotten --train-samples, a changed seed and batch"
  expect_refused "--train-samples 60000 (the checkpoint's: --train-samples 3000)" \
    --train-samples 0
  expect_refused "--seed 7 (the checkpoint's: --seed 1)" --seed 7
  expect_refused "--batch 60 (the checkpoint's: --batch 30)" --batch 60
  echo "== a longer run under the cosine schedule, which would change its steps' rates"
  expect_refused "--epochs 3 (the checkpoint's: --epochs 2)" --epochs 3
  # Under a constant rate, a longer run is the same run, continued.
  echo "== a longer run under a constant rate"
  set -- "$@" --schedule constant --checkpoint "$work/constant.ckpt"
  "$braidrun" -n 2 "$trainer" "$@" --epochs 1
  "$braidrun" -n 2 "$trainer" "$@" --epochs 2 --resume | tee "$work/out.txt"
  grep -q 'resumed from .* after epoch 1' "$work/out.txt" || fail "the longer run did not resume"
  ;;

bad-data)
  expect_data_error() {
    # $1: what the message must name; the rest: the data directory's files
    name=$1
    status=0
    "$trainer" --data "$work/data" --epochs 1 --progress none >"$work/out.txt" 2>&1 || status=$?
    cat "$work/out.txt"
    [ "$status" -eq 66 ] || fail "exit status $status, expected 66"
    grep -q "$name" "$work/out.txt" || fail "the message does not name $name"
    grep -Eq 'apt-get install|--data' "$work/out.txt" || fail "the message names no fix"
  }
  mkdir "$work/data"
  echo "== missing"
  expect_data_error train-images-idx3-ubyte.gz
  echo "== truncated"
  head -c 1000 /dev/urandom >"$work/raw"
  { printf '\000\000\010\003\000\000\352\140\000\000\000\034\000\000\000\034'; cat "$work/raw"; } |
    gzip >"$work/data/train-images-idx3-ubyte.gz"
  printf '\000\000\010\001\000\000\352\140' | gzip >"$work/data/train-labels-idx1-ubyte.gz"
  expect_data_error train-images-idx3-ubyte.gz
  echo "== corrupt"
  { printf '\000\000\010\003\000\000\352\140\000\000\000\034\000\000\000\034'; cat "$work/raw"; } |
    gzip >"$work/data/train-images-idx3-ubyte.gz"
  size=$(wc -c <"$work/data/train-images-idx3-ubyte.gz")
  # Flip bytes in the middle of the deflate stream.
  printf '\377\377\377\377\377\377\377\377' |
    dd of="$work/data/train-images-idx3-ubyte.gz" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
  expect_data_error train-images-idx3-ubyte.gz
  echo "== not IDX"
  echo "hello" | gzip >"$work/data/train-images-idx3-ubyte.gz"
  expect_data_error train-images-idx3-ubyte.gz
  echo "== a header that claims more than any memory holds (2^31 images of 1024x1024)"
  { printf '\000\000\010\003\200\000\000\000\000\000\004\000\000\000\004\000'
    cat "$work/raw"; } | gzip >"$work/data/train-images-idx3-ubyte.gz"
  printf '\000\000\010\001\200\000\000\000' | gzip >"$work/data/train-labels-idx1-ubyte.gz"
  expect_data_error train-images-idx3-ubyte.gz
  grep -q truncated "$work/out.txt" || fail "the message does not say the file is truncated"
  ;;

bad-flags)
  # Out-of-range optimizer settings, and output paths that cannot be written:
  # exit 2 with the flag named, before any training (no data needed). They
  # trained before: NaN weights and exit 0, or a failure after the first
  # epoch.
  expect_usage_error() {
    # $1: what the message must name; the rest: braid-train's flags
    name=$1
    shift
    status=0
    "$trainer" --data "$work/none" --epochs 1 --progress none "$@" >"$work/out.txt" 2>&1 ||
      status=$?
    cat "$work/out.txt"
    [ "$status" -eq 2 ] || fail "$*: exit status $status, expected 2"
    grep -q -- "$name" "$work/out.txt" || fail "$*: the message does not name $name"
    if grep -q "epoch 1" "$work/out.txt"; then fail "$*: it trained"; fi
  }
  expect_usage_error --beta1 --optimizer adam --beta1 1
  expect_usage_error --beta2 --optimizer adam --beta2 1.5
  expect_usage_error --eps --eps -1
  expect_usage_error --momentum --momentum -0.5
  expect_usage_error --weight-decay --weight-decay -1
  expect_usage_error --log --log "$work/no/such/dir/log.csv"
  expect_usage_error --plot --plot "$work/no/such/dir/plot.svg"
  expect_usage_error --checkpoint --checkpoint "$work/no/such/dir/ck"
  expect_usage_error --save-weights --save-weights "$work/no/such/dir/w.bin"
  ;;

*)
  fail "unknown mode '$mode'"
  ;;
esac
