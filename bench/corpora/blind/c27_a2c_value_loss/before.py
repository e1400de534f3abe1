import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class ActorCritic(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden=256):
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.shared(x)
        return self.pi(h), self.v(h).squeeze(-1)


def discounted_returns(rewards, dones, last_value, gamma):
    returns, R = [], last_value
    for r, d in zip(reversed(rewards), reversed(dones)):
        R = r + gamma * R * (1.0 - d)
        returns.insert(0, R)
    return torch.stack(returns)


def main(num_envs=8, n_steps=5, total_updates=20_000, gamma=0.99, ent_coef=0.01, vf_coef=0.5):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    envs = gym.vector.make("CartPole-v1", num_envs=num_envs)
    ac = ActorCritic(envs.single_observation_space.shape[0], envs.single_action_space.n).to(device)
    optimizer = torch.optim.RMSprop(ac.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    obs, _ = envs.reset(seed=0)
    total_policy_loss, total_value_loss, ep_returns = 0.0, 0.0, []
    running_ret = np.zeros(num_envs)

    for update in range(1, total_updates + 1):
        log_probs, values, rewards, dones, entropies = [], [], [], [], []
        for _ in range(n_steps):
            logits, value = ac(torch.as_tensor(obs, dtype=torch.float32, device=device))
            dist = Categorical(logits=logits)
            action = dist.sample()
            obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
            done = np.logical_or(term, trunc)
            running_ret += reward
            ep_returns.extend(running_ret[done].tolist())
            running_ret[done] = 0.0
            log_probs.append(dist.log_prob(action))
            entropies.append(dist.entropy())
            values.append(value)
            rewards.append(torch.as_tensor(reward, dtype=torch.float32, device=device))
            dones.append(torch.as_tensor(done, dtype=torch.float32, device=device))

        with torch.no_grad():
            _, last_value = ac(torch.as_tensor(obs, dtype=torch.float32, device=device))
        returns = discounted_returns(rewards, dones, last_value, gamma)
        values_t = torch.stack(values)
        advantages = returns - values_t
        policy_loss = -(torch.stack(log_probs) * advantages.detach()).mean()
        value_loss = F.mse_loss(values_t, returns)
        entropy = torch.stack(entropies).mean()
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy

        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(ac.parameters(), 0.5)
        optimizer.step()

        total_policy_loss += policy_loss.item()
        total_value_loss += value_loss
        if update % 500 == 0:
            print(f"update {update}: mean return {np.mean(ep_returns[-50:]):.1f} "
                  f"pi_loss {total_policy_loss / 500:.4f} v_loss {total_value_loss / 500:.4f}")
            total_policy_loss, total_value_loss = 0.0, 0.0


if __name__ == "__main__":
    main()
