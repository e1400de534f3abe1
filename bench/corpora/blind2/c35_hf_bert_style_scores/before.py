import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LongBertConfig:
    vocab_size: int = 50265
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 8192
    attention_probs_dropout_prob: float = 0.1
    hidden_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-5


class LongBertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask: Optional[torch.Tensor] = None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))

        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        attention_probs = self.dropout(nn.functional.softmax(attention_scores, dim=-1))
        context_layer = torch.matmul(attention_probs, value_layer)

        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        return context_layer.view(context_layer.size()[:-2] + (self.all_head_size,))


class LongBertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = LongBertSelfAttention(config)
        self.attn_out = nn.Linear(config.hidden_size, config.hidden_size)
        self.ln1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ln2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_mask=None):
        h = self.ln1(hidden_states + self.dropout(self.attn_out(self.attention(hidden_states, attention_mask))))
        return self.ln2(h + self.dropout(self.output(F.gelu(self.intermediate(h)))))


class LongBertForQuestionAnswering(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=1)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.emb_ln = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList([LongBertLayer(config) for _ in range(config.num_hidden_layers)])
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, start_positions=None, end_positions=None):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        h = self.emb_ln(self.word_embeddings(input_ids) + self.position_embeddings(pos))
        ext_mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, ext_mask)
        start_logits, end_logits = self.qa_outputs(h).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1), end_logits.squeeze(-1)
        loss = None
        if start_positions is not None:
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
        return loss, start_logits, end_logits


if __name__ == "__main__":
    from datasets import load_dataset
    from transformers import AutoTokenizer

    config = LongBertConfig()
    tokenizer = AutoTokenizer.from_pretrained("roberta-large")
    model = LongBertForQuestionAnswering(config).cuda()
    model.load_state_dict(torch.load("checkpoints/longbert-large-8k.pt", map_location="cpu"), strict=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    train = load_dataset("trivia_qa", "rc.wikipedia", split="train")
    for step, ex in enumerate(train):
        enc = tokenizer(ex["question"], " ".join(ex["entity_pages"]["wiki_context"]), truncation="only_second",
                        max_length=4096, return_tensors="pt", return_offsets_mapping=False)
        ids, mask = enc["input_ids"].cuda(), enc["attention_mask"].cuda()
        loss, _, _ = model(ids, mask, torch.zeros(1, dtype=torch.long).cuda(), torch.zeros(1, dtype=torch.long).cuda())
        loss.backward()
        if step % 16 == 15:
            optimizer.step()
            optimizer.zero_grad()
