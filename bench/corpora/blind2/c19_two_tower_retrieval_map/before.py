import argparse
import json
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchmetrics.retrieval import RetrievalMAP, RetrievalRecall

logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
log = logging.getLogger("two_tower")


class InteractionLog(Dataset):
    def __init__(self, path, max_hist=50):
        self.rows = [json.loads(l) for l in open(path)]
        self.max_hist = max_hist

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        hist = r["history"][-self.max_hist:]
        hist = hist + [0] * (self.max_hist - len(hist))
        return torch.tensor(r["user_id"]), torch.tensor(hist), torch.tensor(r["item_id"])


class Tower(nn.Module):
    def __init__(self, dim, out_dim=128):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(), nn.Linear(512, out_dim))

    def forward(self, x):
        return F.normalize(self.mlp(x), dim=-1)


class TwoTower(nn.Module):
    def __init__(self, n_users, n_items, dim=128):
        super().__init__()
        self.user_emb = nn.Embedding(n_users, dim)
        self.item_emb = nn.EmbeddingBag(n_items, dim, mode="mean", padding_idx=0)
        self.item_id_emb = nn.Embedding(n_items, dim)
        self.query_tower = Tower(2 * dim)
        self.item_tower = Tower(dim)

    def forward(self, users, hist, items):
        q = self.query_tower(torch.cat([self.user_emb(users), self.item_emb(hist)], dim=-1))
        return q, self.item_tower(self.item_id_emb(items))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", default="data/interactions/train.jsonl")
    parser.add_argument("--n_users", type=int, default=2_000_000)
    parser.add_argument("--n_items", type=int, default=500_000)
    parser.add_argument("--batch_size", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.05)
    args = parser.parse_args()

    device = torch.device("cuda")
    loader = DataLoader(InteractionLog(args.train), batch_size=args.batch_size, shuffle=True,
                        num_workers=8, drop_last=True)
    model = TwoTower(args.n_users, args.n_items).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_map = RetrievalMAP(top_k=10).to(device)
    train_recall = RetrievalRecall(top_k=10).to(device)
    labels = torch.arange(args.batch_size, device=device)
    target = torch.eye(args.batch_size, dtype=torch.bool, device=device)

    global_step = 0
    for epoch in range(args.epochs):
        for users, hist, items in loader:
            users, hist, items = users.to(device), hist.to(device), items.to(device)
            q, d = model(users, hist, items)
            scores = q @ d.t()
            loss = F.cross_entropy(scores / args.temperature, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if global_step % 100 == 0:
                indexes = (labels + global_step * args.batch_size).unsqueeze(1).expand_as(scores)
                train_map.update(scores.detach(), target, indexes=indexes)
                train_recall(scores.detach(), target, indexes=indexes)
                log.info("step %d loss %.4f recall@10 %.4f", global_step, loss.item(),
                         train_recall.compute().item())
                train_recall.reset()
            global_step += 1
        log.info("epoch %d in-batch MAP@10 %.4f", epoch, train_map.compute().item())
        torch.save(model.state_dict(), f"checkpoints/two_tower_{epoch}.pt")


if __name__ == "__main__":
    main()
