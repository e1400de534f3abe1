import argparse
import os.path as osp

import torch
import torch.nn.functional as F
from ogb.nodeproppred import PygNodePropPredDataset
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import SAGEConv


class GraphSAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.5):
        super().__init__()
        self.convs = torch.nn.ModuleList()
        self.convs.append(SAGEConv(in_channels, hidden_channels))
        for _ in range(num_layers - 2):
            self.convs.append(SAGEConv(hidden_channels, hidden_channels))
        self.convs.append(SAGEConv(hidden_channels, out_channels))
        self.dropout = dropout

    def forward(self, x, edge_index, return_hidden=False):
        for i, conv in enumerate(self.convs):
            if return_hidden and i == len(self.convs) - 1:
                return x
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
                x = F.dropout(x, p=self.dropout, training=self.training)
        return x


@torch.no_grad()
def export_embeddings(model, loader, device):
    model.eval()
    chunks = []
    for batch in loader:
        batch = batch.to(device)
        h = model(batch.x, batch.edge_index, return_hidden=True)
        chunks.append(h[: batch.batch_size])
    return torch.cat(chunks, dim=0)


def main():
    parser = argparse.ArgumentParser(description="Export GraphSAGE node embeddings for downstream retrieval")
    parser.add_argument("--root", default="/data/ogb")
    parser.add_argument("--dataset", default="ogbn-products")
    parser.add_argument("--checkpoint", default="checkpoints/sage_products.pt")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--fanout", type=int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--out", default="embeddings/products_sage.pt")
    args = parser.parse_args()

    dataset = PygNodePropPredDataset(args.dataset, root=args.root)
    data = dataset[0]
    device = torch.device("cuda")
    model = GraphSAGE(data.num_features, args.hidden, dataset.num_classes, num_layers=len(args.fanout))
    model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    model.to(device)

    loader = NeighborLoader(data, input_nodes=None, num_neighbors=args.fanout,
                            batch_size=args.batch_size, shuffle=False, num_workers=12, persistent_workers=True)
    emb = export_embeddings(model, loader, device)
    print(f"exported {emb.size(0)} x {emb.size(1)} embeddings")
    torch.save(emb.cpu(), args.out)
    print(f"saved to {osp.abspath(args.out)}")


if __name__ == "__main__":
    main()
