import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class RecurrentAgent(nn.Module):
    def __init__(self, n_actions, hidden=512):
        super().__init__()
        self.torso = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 7 * 7, hidden), nn.ReLU(),
        )
        self.gru = nn.GRUCell(hidden, hidden)
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)

    def forward(self, obs, h):
        h = self.gru(self.torso(obs / 255.0), h)
        return self.actor(h), self.critic(h).squeeze(-1), h


def compute_gae(rewards, values, dones, last_value, gamma, lam):
    adv = torch.zeros_like(rewards)
    last = 0.0
    for t in reversed(range(rewards.size(0))):
        next_v = last_value if t == rewards.size(0) - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_v * (1 - dones[t]) - values[t]
        last = delta + gamma * lam * (1 - dones[t]) * last
        adv[t] = last
    return adv, adv + values


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--total-timesteps", type=int, default=10_000_000)
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip-coef", type=float, default=0.1)
    p.add_argument("--update-epochs", type=int, default=4)
    args = p.parse_args()

    device = torch.device("cuda")
    envs = gym.vector.SyncVectorEnv([
        lambda: gym.wrappers.FrameStack(gym.wrappers.AtariPreprocessing(gym.make(args.env_id)), 4)
        for _ in range(args.num_envs)
    ])
    agent = RecurrentAgent(envs.single_action_space.n).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    obs, _ = envs.reset(seed=1)
    done = torch.zeros(args.num_envs, device=device)
    h = torch.zeros(args.num_envs, 512, device=device)
    num_updates = args.total_timesteps // (args.num_envs * args.num_steps)
    start = time.time()
    for update in range(1, num_updates + 1):
        init_h = h.detach().clone()
        buf_obs, buf_act, buf_logp, buf_val, buf_rew, buf_done = [], [], [], [], [], []
        for step in range(args.num_steps):
            h = h.detach()
            obs_t = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=device)
            h = h * (1.0 - done).unsqueeze(-1)
            logits, value, h = agent(obs_t, h)
            dist = Categorical(logits=logits)
            action = dist.sample()
            obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
            buf_obs.append(obs_t)
            buf_act.append(action)
            buf_logp.append(dist.log_prob(action).detach())
            buf_val.append(value.detach())
            buf_rew.append(torch.as_tensor(reward, dtype=torch.float32, device=device))
            buf_done.append(done)
            done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32, device=device)

        with torch.no_grad():
            obs_t = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=device)
            _, last_value, _ = agent(obs_t, h * (1.0 - done).unsqueeze(-1))
        rewards, values, dones = torch.stack(buf_rew), torch.stack(buf_val), torch.stack(buf_done)
        adv, returns = compute_gae(rewards, values, dones, last_value, args.gamma, args.gae_lambda)
        old_logp, actions = torch.stack(buf_logp), torch.stack(buf_act)

        for _ in range(args.update_epochs):
            hh, new_logits, new_values = init_h, [], []
            for t in range(args.num_steps):
                hh = hh * (1.0 - dones[t]).unsqueeze(-1)
                lg, v, hh = agent(buf_obs[t], hh)
                new_logits.append(lg)
                new_values.append(v)
            dist = Categorical(logits=torch.stack(new_logits))
            ratio = (dist.log_prob(actions) - old_logp).exp()
            norm_adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-norm_adv * ratio,
                                -norm_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = F.mse_loss(torch.stack(new_values), returns)
            loss = pg_loss + 0.5 * v_loss - 0.01 * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()

        if update % 10 == 0:
            sps = int(update * args.num_envs * args.num_steps / (time.time() - start))
            print(f"update {update}/{num_updates} loss={loss.item():.3f} sps={sps}")


if __name__ == "__main__":
    main()
