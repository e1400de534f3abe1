import torch
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased").cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

losses = []
all_logits = []
per_step = {}
for step, batch in enumerate(train_loader):
    outputs = model(**batch)
    outputs.loss.backward()
    optimizer.step()
    optimizer.zero_grad()

    # Kept for the plots at the end of the run.
    losses.append(outputs.loss)
    all_logits.append(outputs.logits.to("cpu", non_blocking=True))
    per_step[step] = (outputs.loss, batch["labels"])
    losses.append(outputs.loss.item())  # already a number

plot(losses, torch.cat(all_logits), per_step)
