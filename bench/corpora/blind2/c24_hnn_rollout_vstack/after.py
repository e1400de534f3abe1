"""Roll out a learned Hamiltonian for an N-body system and save the trajectory."""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn


class HamiltonianNet(nn.Module):
    def __init__(self, dim, hidden=512):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2 * dim, hidden), nn.Softplus(),
            nn.Linear(hidden, hidden), nn.Softplus(),
            nn.Linear(hidden, 1),
        )

    def forward(self, q, p):
        return self.net(torch.cat([q, p], dim=-1)).sum()


def symplectic_field(model, q, p):
    with torch.enable_grad():
        q = q.detach().requires_grad_(True)
        p = p.detach().requires_grad_(True)
        H = model(q, p)
        dHdq, dHdp = torch.autograd.grad(H, (q, p))
    return dHdp, -dHdq


def leapfrog(model, q, p, dt):
    _, dp = symplectic_field(model, q, p)
    p_half = p + 0.5 * dt * dp
    dq, _ = symplectic_field(model, q, p_half)
    q_next = q + dt * dq
    _, dp = symplectic_field(model, q_next, p_half)
    return q_next, p_half + 0.5 * dt * dp


def load_initial_conditions(path, device):
    data = np.load(path)
    return (torch.as_tensor(data["q0"], dtype=torch.float32, device=device),
            torch.as_tensor(data["p0"], dtype=torch.float32, device=device))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="runs/hnn_nbody/model.pt")
    parser.add_argument("--init", default="data/nbody_test_init.npz")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--save_every", type=int, default=10)
    parser.add_argument("--out", default="rollouts/nbody_hnn.npy")
    args = parser.parse_args()

    device = torch.device("cuda")
    q, p = load_initial_conditions(args.init, device)
    model = HamiltonianNet(q.shape[-1])
    model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    model.to(device).eval()

    trajectory = [torch.cat([q, p], dim=-1).unsqueeze(0)]
    t0 = time.time()
    for step in range(1, args.steps + 1):
        q, p = leapfrog(model, q, p, args.dt)
        if step % args.save_every == 0:
            trajectory.append(torch.cat([q, p], dim=-1).unsqueeze(0))
        if step % 1000 == 0:
            with torch.no_grad():
                energy = model(q, p).item()
            print(f"step {step}: H={energy:.6f} ({time.time() - t0:.1f}s)")

    trajectory = torch.vstack(trajectory)
    np.save(args.out, trajectory.cpu().numpy())
    print(f"saved trajectory {tuple(trajectory.shape)} to {args.out}")


if __name__ == "__main__":
    main()
