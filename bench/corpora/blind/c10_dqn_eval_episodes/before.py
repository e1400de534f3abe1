import random
from collections import deque

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_actions))

    def forward(self, x):
        return self.net(x)


def evaluate_policy(env, q_net, device, n_episodes=10):
    q_net.eval()
    returns = []
    for ep in range(n_episodes):
        obs, _ = env.reset(seed=1000 + ep)
        done, ep_ret = False, 0.0
        while not done:
            state = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            q_values = q_net(state)
            action = int(q_values.argmax(dim=1).item())
            obs, reward, terminated, truncated, _ = env.step(action)
            ep_ret += reward
            done = terminated or truncated
        returns.append(ep_ret)
    q_net.train()
    return float(np.mean(returns)), float(np.std(returns))


def train(total_steps=200_000, gamma=0.99, batch_size=64, eval_every=10_000):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env, eval_env = gym.make("LunarLander-v2"), gym.make("LunarLander-v2")
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    q_net = QNetwork(obs_dim, n_actions).to(device)
    target_net = QNetwork(obs_dim, n_actions).to(device)
    target_net.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=5e-4)
    buffer = deque(maxlen=100_000)
    obs, _ = env.reset(seed=0)

    for step in range(total_steps):
        eps = max(0.05, 1.0 - step / 50_000)
        if random.random() < eps:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = int(q_net(torch.as_tensor(obs, device=device).unsqueeze(0)).argmax().item())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.append((obs, action, reward, next_obs, float(terminated)))
        obs = next_obs if not (terminated or truncated) else env.reset()[0]

        if len(buffer) >= 1000:
            batch = random.sample(buffer, batch_size)
            s, a, r, s2, d = (torch.as_tensor(np.array(x), device=device) for x in zip(*batch))
            with torch.no_grad():
                target = r.float() + gamma * (1 - d.float()) * target_net(s2.float()).max(1).values
            q = q_net(s.float()).gather(1, a.long().unsqueeze(1)).squeeze(1)
            loss = F.smooth_l1_loss(q, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % 1000 == 0:
            target_net.load_state_dict(q_net.state_dict())
        if step % eval_every == 0 and step > 0:
            mean_ret, std_ret = evaluate_policy(eval_env, q_net, device)
            print(f"step {step}: eval return {mean_ret:.1f} +/- {std_ret:.1f}")


if __name__ == "__main__":
    train()
