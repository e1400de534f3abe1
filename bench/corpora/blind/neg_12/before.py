import argparse
from itertools import count

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical


class Policy(nn.Module):
    def __init__(self, obs_dim=4, n_actions=2, hidden=128):
        super().__init__()
        self.affine1 = nn.Linear(obs_dim, hidden)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(hidden, n_actions)

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


def select_action(policy, state, saved_log_probs):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode(policy, optimizer, saved_log_probs, rewards, gamma, eps=np.finfo(np.float32).eps.item()):
    R, returns = 0.0, []
    for r in reversed(rewards):
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    policy_loss = torch.cat([-log_prob * ret for log_prob, ret in zip(saved_log_probs, returns)]).sum()
    optimizer.zero_grad()
    policy_loss.backward()
    optimizer.step()
    del saved_log_probs[:]
    del rewards[:]


def main():
    parser = argparse.ArgumentParser(description="PyTorch REINFORCE example")
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=543)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    env = gym.make("CartPole-v1")
    env.reset(seed=args.seed)
    torch.manual_seed(args.seed)
    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)
    saved_log_probs, rewards = [], []
    running_reward = 10.0
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0.0
        for t in range(1, 10000):
            action = select_action(policy, state, saved_log_probs)
            state, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        finish_episode(policy, optimizer, saved_log_probs, rewards, args.gamma)
        if i_episode % args.log_interval == 0:
            print(f"Episode {i_episode}\tLast reward: {ep_reward:.2f}\tAverage reward: {running_reward:.2f}")
        if running_reward > env.spec.reward_threshold:
            print(f"Solved! Running reward is now {running_reward} and the last episode runs to {t} time steps!")
            break


if __name__ == "__main__":
    main()
