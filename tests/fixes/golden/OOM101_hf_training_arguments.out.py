from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)

training_args = TrainingArguments(
    output_dir="runs/bert-imdb",
    # Large batches made the loss curve smoother on the paper's TPU pod.
    per_device_train_batch_size=32,
    per_device_eval_batch_size=256,
    gradient_accumulation_steps=1,
    learning_rate=2e-5,
    num_train_epochs=3,
)

trainer = Trainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=test_ds)
trainer.train()
