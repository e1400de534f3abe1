import argparse
import logging

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

log = logging.getLogger("cellgraph")


@torch.no_grad()
def build_knn_graph(pos, k, chunk=512):
    """Directed k-NN graph over cell centroids, computed in row chunks."""
    n = pos.size(0)
    edge_index = torch.empty(2, 0, dtype=torch.long, device=pos.device)
    for start in range(0, n, chunk):
        block = pos[start:start + chunk]
        dist = torch.cdist(block, pos)
        dist[torch.arange(block.size(0)), torch.arange(start, start + block.size(0))] = float("inf")
        nbrs = dist.topk(k, dim=1, largest=False).indices
        src = nbrs.flatten()
        dst = torch.arange(start, start + block.size(0), device=pos.device).repeat_interleave(k)
        edge_index = torch.cat([edge_index, torch.stack([src, dst])], dim=1)
    return edge_index


class CellGCN(nn.Module):
    def __init__(self, in_dim, hidden, n_types, layers=4):
        super().__init__()
        dims = [in_dim] + [hidden] * layers
        self.convs = nn.ModuleList([GCNConv(a, b, cached=True) for a, b in zip(dims[:-1], dims[1:])])
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(layers)])
        self.head = nn.Linear(hidden, n_types)

    def forward(self, x, edge_index):
        for conv, norm in zip(self.convs, self.norms):
            x = F.gelu(norm(conv(x, edge_index))) + (x if x.size(-1) == conv.out_channels else 0)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser(description="Cell-type classification on a spatial transcriptomics section")
    parser.add_argument("--cells", default="/data/xenium/section_07/cells.npz")
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=300)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda")
    raw = np.load(args.cells)
    pos = torch.as_tensor(raw["centroids"], dtype=torch.float32, device=device)
    x = torch.as_tensor(np.log1p(raw["counts"]), dtype=torch.float32, device=device)
    y = torch.as_tensor(raw["labels"], dtype=torch.long, device=device)
    train_mask = torch.as_tensor(raw["train_mask"], device=device)
    log.info("%d cells, %d genes", x.size(0), x.size(1))

    data = Data(x=x, y=y, pos=pos, edge_index=build_knn_graph(pos, args.k))
    log.info("graph has %d edges", data.edge_index.size(1))
    model = CellGCN(x.size(1), args.hidden, int(y.max()) + 1).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    for epoch in range(args.epochs):
        model.train()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[train_mask], data.y[train_mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if epoch % 20 == 0:
            with torch.no_grad():
                acc = (out.argmax(1)[~train_mask] == data.y[~train_mask]).float().mean().item()
            log.info("epoch %d loss %.4f held-out acc %.4f", epoch, loss.item(), acc)


if __name__ == "__main__":
    main()
