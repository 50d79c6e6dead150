set -x
. /work/main/.venv/bin/activate
cd /tmp/walk_avg
/usr/bin/time -f "train %e s" flaxformer-mini train --data data/cmudict/train.tsv --valid data/cmudict/valid.tsv --preset small \
    --max-len 32 --batch-size 64 --lr 3e-3 --warmup 200 --steps 1200 --eval-every 150 --save-every 150 --keep 5 \
    --best-metric wer --out runs/g2p-best
flaxformer-mini average --checkpoint runs/g2p-best --last 3 --out runs/g2p-avg3
for r in runs/g2p-best runs/g2p-best/best runs/g2p-avg3; do
  flaxformer-mini evaluate --checkpoint $r --data data/cmudict/valid.tsv --json --batch-size 256
done
