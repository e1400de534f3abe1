import argparse
import copy
import os

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(inp, out, hidden=1024):
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))


class Actor(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim)

    def forward(self, obs):
        mu, log_std = self.net(obs).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        dist = torch.distributions.Normal(mu, std)
        u = dist.rsample()
        a = torch.tanh(u)
        logp = (dist.log_prob(u) - torch.log(1 - a.pow(2) + 1e-6)).sum(-1)
        return a, logp


class ReplayBuffer:
    def __init__(self, obs_dim, act_dim, capacity, device):
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.act = torch.zeros(capacity, act_dim, device=device)
        self.rew = torch.zeros(capacity, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)
        self.done = torch.zeros(capacity, device=device)
        self.ptr, self.size, self.capacity = 0, 0, capacity

    def add(self, o, a, r, o2, d):
        i = self.ptr
        self.obs[i], self.act[i], self.next_obs[i] = torch.as_tensor(o), torch.as_tensor(a), torch.as_tensor(o2)
        self.rew[i], self.done[i] = float(r), float(d)
        self.ptr, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, n):
        idx = torch.randint(0, self.size, (n,), device=self.obs.device)
        return self.obs[idx], self.act[idx], self.rew[idx], self.next_obs[idx], self.done[idx]

    def state_dict(self):
        return {k: getattr(self, k) for k in ("obs", "act", "rew", "next_obs", "done", "ptr", "size")}

    def load_state_dict(self, sd):
        for k, v in sd.items():
            getattr(self, k).copy_(v) if torch.is_tensor(v) else setattr(self, k, v)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="Humanoid-v4")
    p.add_argument("--run_dir", default="runs/sac_humanoid")
    p.add_argument("--total_steps", type=int, default=10_000_000)
    p.add_argument("--buffer", type=int, default=5_000_000)
    args = p.parse_args()

    device = torch.device("cuda")
    env = gym.make(args.env)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    actor = Actor(obs_dim, act_dim).to(device)
    q1, q2 = mlp(obs_dim + act_dim, 1).to(device), mlp(obs_dim + act_dim, 1).to(device)
    q1_t, q2_t = copy.deepcopy(q1), copy.deepcopy(q2)
    log_alpha = torch.zeros(1, device=device, requires_grad=True)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    q_opt = torch.optim.Adam(list(q1.parameters()) + list(q2.parameters()), lr=3e-4)
    alpha_opt = torch.optim.Adam([log_alpha], lr=3e-4)
    buffer = ReplayBuffer(obs_dim, act_dim, args.buffer, device)

    step = 0
    resume_path = os.path.join(args.run_dir, "latest.pt")
    if os.path.exists(resume_path):
        ckpt = torch.load(resume_path)
        for name, obj in [("actor", actor), ("q1", q1), ("q2", q2), ("q1_t", q1_t), ("q2_t", q2_t),
                          ("a_opt", a_opt), ("q_opt", q_opt), ("alpha_opt", alpha_opt), ("buffer", buffer)]:
            obj.load_state_dict(ckpt[name])
        log_alpha.data.copy_(ckpt["log_alpha"])
        step = ckpt["step"]
        print(f"resumed at step {step} with {buffer.size} transitions")

    obs, _ = env.reset()
    while step < args.total_steps:
        with torch.no_grad():
            act, _ = actor(torch.as_tensor(obs, dtype=torch.float32, device=device))
        nxt, rew, term, trunc, _ = env.step(act.cpu().numpy())
        buffer.add(obs, act, rew, nxt, term)
        obs = env.reset()[0] if term or trunc else nxt
        step += 1
        if buffer.size > 10_000:
            o, a, r, o2, d = buffer.sample(1024)
            with torch.no_grad():
                a2, logp2 = actor(o2)
                target = r + 0.99 * (1 - d) * (torch.min(q1_t(torch.cat([o2, a2], -1)), q2_t(torch.cat([o2, a2], -1))).squeeze(-1) - log_alpha.exp() * logp2)
            q_loss = F.mse_loss(q1(torch.cat([o, a], -1)).squeeze(-1), target) + F.mse_loss(q2(torch.cat([o, a], -1)).squeeze(-1), target)
            q_opt.zero_grad(); q_loss.backward(); q_opt.step()
            a_new, logp = actor(o)
            a_loss = (log_alpha.exp().detach() * logp - torch.min(q1(torch.cat([o, a_new], -1)), q2(torch.cat([o, a_new], -1))).squeeze(-1)).mean()
            a_opt.zero_grad(); a_loss.backward(); a_opt.step()
            alpha_loss = -(log_alpha * (logp.detach() - act_dim).mean())
            alpha_opt.zero_grad(); alpha_loss.backward(); alpha_opt.step()
            with torch.no_grad():
                for net, tgt in ((q1, q1_t), (q2, q2_t)):
                    for p_, tp in zip(net.parameters(), tgt.parameters()):
                        tp.lerp_(p_, 0.005)
        if step % 100_000 == 0:
            state = {"actor": actor.state_dict(), "q1": q1.state_dict(), "q2": q2.state_dict(), "q1_t": q1_t.state_dict(),
                     "q2_t": q2_t.state_dict(), "a_opt": a_opt.state_dict(), "q_opt": q_opt.state_dict(),
                     "alpha_opt": alpha_opt.state_dict(), "buffer": buffer.state_dict(), "log_alpha": log_alpha, "step": step}
            torch.save(state, resume_path)


if __name__ == "__main__":
    main()
