"""Classification scores over a whole split, from predicted and true class ids (1-D integer tensors).

    confusion[i, j] = #{n : y_n = i, yhat_n = j}                      rows true, columns predicted
    accuracy        = trace(confusion) / N
    F1_k            = 2 TP_k / (2 TP_k + FP_k + FN_k)   (0 when class k is never true nor predicted)
    macro-F1        = mean_k F1_k over all K classes, absent ones included (scikit-learn's
                      ``f1_score(average="macro", labels=range(K), zero_division=0)``)
"""

from __future__ import annotations

import torch
from torch import Tensor


def confusion_matrix(true: Tensor, pred: Tensor, n_classes: int) -> Tensor:
    """(K, K) int64 counts, rows the true class, columns the predicted one."""
    flat = true.long() * n_classes + pred.long()
    return torch.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def accuracy(true: Tensor, pred: Tensor) -> float:
    """The fraction of predictions equal to the truth (0 for no rows)."""
    return float((true == pred).float().mean()) if len(true) else 0.0


def macro_f1(true: Tensor, pred: Tensor, n_classes: int) -> float:
    """The mean over all ``n_classes`` of each class's F1 (0 for a class never true nor predicted)."""
    cm = confusion_matrix(true, pred, n_classes).double()
    tp = cm.diagonal()
    denominator = 2 * tp + (cm.sum(0) - tp) + (cm.sum(1) - tp)  # 2 TP + FP + FN
    f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
    return float(f1.mean())
