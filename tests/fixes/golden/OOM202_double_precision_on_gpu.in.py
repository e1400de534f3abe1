"""Physics-informed net: someone switched everything to float64 "for accuracy"."""

import torch as T
from torch import float64

T.set_default_dtype(T.float64)  # global switch
device = T.device("cuda:0")

model = PINN(layers=[2, 256, 256, 1]).double().to(device)
collocation = T.rand(
    100_000,
    2,
    device=device,
    dtype=T.double,  # x, t
)
boundary = T.zeros(1_000, 2).to(device, float64)
counts = T.from_numpy(histogram).double()  # a CPU histogram, fine
energy = T.sum(u * u, dim=1, dtype=T.float64)
accuracy = (pred == target).double().mean()
