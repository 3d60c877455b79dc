"""Multi-scale training of a small convolutional classifier.

Every step trains on a batch at a new resolution, each side drawn from 192 to
512 pixels, so the network learns to classify at every scale. The resolutions
are the point of the exercise and stay as they are: padding images to a common
size would change what the convolutions and batch norm see at the borders, and
resizing would change the data. The largest batch alone fits the memory budget
with room to spare, yet again and again the allocator runs out of cached room:
it gives back its entirely free segments, synchronises and retries, near an OOM.
Find out where the memory goes, and make the run stop retrying without
changing the model, the data, the resolutions or the loss.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
n_classes, widths = 10, (32, 64, 128, 256)
batch_size, min_side, max_side, steps = 16, 192, 512, 40


def conv_bn(c_in, c_out, stride=1):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c_in = [], 3
        for i, c in enumerate(widths):
            layers += [conv_bn(c_in, c, stride=2), conv_bn(c, c)]  # each stage halves the resolution
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, n_classes)

    def forward(self, images):
        return self.head(self.features(images).mean(dim=(2, 3)))


torch.manual_seed(0)
torch.backends.cudnn.deterministic = True  # reproducible runs: the same kernels, the same sums, every time
model = ConvNet().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
palette = torch.randn(n_classes, 3, device=device)  # each class tints its images with its own colour


def get_batch(gen):
    """Noise images tinted by their class colour, at a random resolution (multiples of 32)."""
    h, w = (int(s) * 32 for s in torch.randint(min_side // 32, max_side // 32 + 1, (2,), device=device, generator=gen))
    labels = torch.randint(n_classes, (batch_size,), device=device, generator=gen)
    images = torch.randn(batch_size, 3, h, w, device=device, generator=gen) + palette[labels, :, None, None]
    return images, labels


gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    images, labels = get_batch(gen)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  {images.shape[2]}x{images.shape[3]}  loss {loss.item():.4f}")
