import torch as T


def embed_epochs(encoder, loader, epochs):
    history = []
    for epoch in range(epochs):
        feats = T.zeros(0, encoder.dim, device="cuda")
        feats_parts = [feats]
        for batch in loader:
            out = encoder(batch.cuda()).detach()
            feats_parts.append(out)
        feats = T.cat(feats_parts, dim=0)
        history.append(feats.mean(0).cpu())

        # keep a running window of the last batches (bounded size: not flagged)
        window = T.cat([window[-4:], out])
    return history
