import argparse
import random
from collections import deque

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class DRQN(nn.Module):
    def __init__(self, n_actions, hidden=512):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
        self.lstm = nn.LSTM(64 * 7 * 7, hidden, batch_first=True)
        self.q = nn.Linear(hidden, n_actions)
        self.hidden = hidden

    def forward(self, obs, state):
        b, t = obs.shape[:2]
        z = self.conv(obs.flatten(0, 1).unsqueeze(1) / 255.0).view(b, t, -1)
        out, state = self.lstm(z, state)
        return self.q(out), state

    def init_state(self, batch, device):
        return (torch.zeros(1, batch, self.hidden, device=device),
                torch.zeros(1, batch, self.hidden, device=device))


def learn(online, target, optimizer, replay, args, device):
    episodes = random.sample(replay, args.batch_size)
    seqs = []
    for ep in episodes:
        s = random.randint(0, len(ep["obs"]) - args.seq_len - 1)
        seqs.append({k: v[s:s + args.seq_len + 1] for k, v in ep.items()})
    obs = torch.as_tensor(np.stack([s["obs"] for s in seqs]), device=device).float()
    act = torch.as_tensor(np.stack([s["act"][:-1] for s in seqs]), device=device).long()
    rew = torch.as_tensor(np.stack([s["rew"][:-1] for s in seqs]), device=device).float()
    done = torch.as_tensor(np.stack([s["done"][:-1] for s in seqs]), device=device).float()
    q, _ = online(obs[:, :-1], online.init_state(args.batch_size, device))
    with torch.no_grad():
        q_next, _ = target(obs[:, 1:], target.init_state(args.batch_size, device))
        y = rew + args.gamma * (1 - done) * q_next.max(-1).values
    loss = F.smooth_l1_loss(q.gather(-1, act.unsqueeze(-1)).squeeze(-1), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="ALE/MsPacman-v5")
    parser.add_argument("--total_steps", type=int, default=10_000_000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=10)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--replay_episodes", type=int, default=2000)
    parser.add_argument("--target_every", type=int, default=10_000)
    args = parser.parse_args()

    device = torch.device("cuda")
    env = gym.wrappers.ResizeObservation(gym.wrappers.GrayScaleObservation(gym.make(args.env)), 84)
    n_actions = env.action_space.n
    online, target = DRQN(n_actions).to(device), DRQN(n_actions).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-4)
    replay = deque(maxlen=args.replay_episodes)

    obs, _ = env.reset()
    hidden = online.init_state(1, device)
    episode = {"obs": [obs], "act": [], "rew": [], "done": []}
    for step in range(args.total_steps):
        eps = max(0.05, 1.0 - step / 1_000_000)
        obs_t = torch.as_tensor(obs, device=device).float().view(1, 1, 84, 84)
        q, hidden = online(obs_t, hidden)
        action = random.randrange(n_actions) if random.random() < eps else q[0, -1].argmax().item()
        obs, reward, term, trunc, _ = env.step(action)
        episode["obs"].append(obs)
        episode["act"].append(action)
        episode["rew"].append(reward)
        episode["done"].append(float(term))
        if term or trunc:
            episode["act"].append(0)
            episode["rew"].append(0.0)
            episode["done"].append(1.0)
            replay.append({k: np.asarray(v) for k, v in episode.items()})
            obs, _ = env.reset()
            hidden = online.init_state(1, device)
            episode = {"obs": [obs], "act": [], "rew": [], "done": []}
        if len(replay) >= 64 and step % 4 == 0:
            loss = learn(online, target, optimizer, replay, args, device)
            if step % 10_000 == 0:
                print(f"step {step} eps {eps:.2f} loss {loss:.4f}")
        if step % args.target_every == 0:
            target.load_state_dict(online.state_dict())


if __name__ == "__main__":
    main()
