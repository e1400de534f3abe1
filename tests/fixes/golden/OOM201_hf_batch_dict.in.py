"""A Hugging Face model fine-tuned with a plain loop: the batch is a dict moved key by key."""

import torch
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("distilbert-base-uncased").to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

model.train()
for step, batch in enumerate(train_dataloader):
    batch = {key: value.to("cuda") for key, value in batch.items()}
    outputs = model(**batch)
    loss = outputs.loss
    running_loss += loss.item()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
