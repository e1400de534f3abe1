"""Second-order MAML for few-shot classification (functional fast weights)."""
import torch
import torch.nn.functional as F
from torch.func import functional_call


def inner_adapt(learner, params, support_x, support_y, inner_lr, steps, second_order=True):
    fast = dict(params)
    for _ in range(steps):
        logits = functional_call(learner, fast, (support_x,))
        inner_loss = F.cross_entropy(logits, support_y)
        grads = torch.autograd.grad(inner_loss, list(fast.values()), create_graph=second_order)
        fast = {name: w - inner_lr * g for (name, w), g in zip(fast.items(), grads)}
    return fast


def meta_train(learner, task_sampler, meta_steps=60_000, meta_batch=4, inner_lr=0.4, inner_steps=1,
               meta_lr=1e-3, device="cuda"):
    learner.to(device).train()
    meta_opt = torch.optim.Adam(learner.parameters(), lr=meta_lr)
    for step in range(meta_steps):
        params = dict(learner.named_parameters())
        query_losses, query_accs = [], []
        for _ in range(meta_batch):
            sx, sy, qx, qy = (t.to(device) for t in task_sampler.sample())
            fast = inner_adapt(learner, params, sx, sy, inner_lr, inner_steps)
            q_logits = functional_call(learner, fast, (qx,))
            query_losses.append(F.cross_entropy(q_logits, qy))
            query_accs.append((q_logits.argmax(1) == qy).float().mean().item())
        meta_loss = torch.stack(query_losses).mean()
        meta_opt.zero_grad()
        meta_loss.backward()
        meta_opt.step()

        if step % 500 == 0:
            print(f"meta step {step}: query loss {meta_loss.item():.4f} acc {sum(query_accs) / meta_batch:.4f}")
    return learner


def meta_test(learner, task_sampler, n_tasks=600, inner_lr=0.4, inner_steps=10, device="cuda"):
    learner.to(device).eval()
    accs = []
    params = {k: v.detach().requires_grad_(True) for k, v in learner.named_parameters()}
    for _ in range(n_tasks):
        sx, sy, qx, qy = (t.to(device) for t in task_sampler.sample())
        fast = inner_adapt(learner, params, sx, sy, inner_lr, inner_steps, second_order=False)
        with torch.no_grad():
            q_logits = functional_call(learner, fast, (qx,))
        accs.append((q_logits.argmax(1) == qy).float().mean().item())
    mean = sum(accs) / len(accs)
    std = (sum((a - mean) ** 2 for a in accs) / len(accs)) ** 0.5
    return mean, 1.96 * std / len(accs) ** 0.5


if __name__ == "__main__":
    from fewshot import Conv4, OmniglotTaskSampler

    net = Conv4(out_features=5)
    meta_train(net, OmniglotTaskSampler("train", n_way=5, k_shot=1, q_query=15))
    acc, ci = meta_test(net, OmniglotTaskSampler("test", n_way=5, k_shot=1, q_query=15))
    print(f"meta-test accuracy {acc:.4f} +/- {ci:.4f}")
