#!/usr/bin/env python3
"""Saves the TorchScript model that torchscript_stages.cpp trains: a scripted nn.Sequential whose
children become the pipeline's layers. The package test runs it with the venv's Python:

    python save_scripted_model.py model.pt && ./torchscript_stages model.pt
"""
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
torch.jit.save(torch.jit.script(model), sys.argv[1])
