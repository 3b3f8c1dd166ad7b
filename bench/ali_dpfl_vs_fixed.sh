#!/usr/bin/env bash
# ALI-DPFL vs FedAvg+DP at fixed tau in the paper's FashionMNIST setting (ALI-DPFL Table II):
# Dir(0.05), 10 clients, Table V CNN, q=0.015, sigma=1.1, delta=1e-5, eta=0.5, eps=2, Gamma=10.
# R_c = 553 DP-SGD steps, so R_s = R_c/2 = 276 rounds.
#   bash bench/ali_dpfl_vs_fixed.sh [SEEDS]      (comma-separated, default: 0,1,2)
# Re-running skips the runs already complete. Then:
#   python -m analysis runs/ali_vs_fixed-fixed runs/ali_vs_fixed-ali --out runs/ali_vs_fixed-analysis
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-0,1,2}
PAPER=(scenario=ali_dpfl_vs_fixed.yaml data.dataset=fashion_mnist data.partition=dirichlet data.dirichlet_beta=0.05
       model.name=cnn_fmnist clients.n=10 dp.q=0.015 dp.sigma=1.1 dp.delta=1e-5 dp.lr=0.5 dp.epsilon=2
       ali_dpfl.gamma=10 budget.rounds=276 output.progress=false)
python -m emulator --multirun "${PAPER[@]}" policy=fedavg_dp dp.tau=1,2,3,5,10 "seed=$SEEDS" output.name=ali_vs_fixed-fixed
python -m emulator --multirun "${PAPER[@]}" policy=ali_dpfl "seed=$SEEDS" output.name=ali_vs_fixed-ali
