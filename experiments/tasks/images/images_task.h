/* "images": autoregressive modelling of images, pixel value by pixel value (the image
 * experiments of "Transformers are RNNs": MNIST and CIFAR-10 bits/dim), a dataset task
 * with splits (task.h).
 *
 * Data (folder "path", as experiments/images/get-data.sh makes it; readers in
 * image_data.h):
 *   dataset "mnist", "fashion-mnist": IDX files train-images-idx3-ubyte,
 *     train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each
 *     plain or gzip-compressed (the name with ".gz"; the plain one is taken when both
 *     exist). Images of any rows x cols (28 x 28 for the real sets), labels in [0, 10).
 *   dataset "cifar10": the binary release, data_batch_1.bin .. data_batch_5.bin
 *     (training) and test_batch.bin, 32 x 32 x 3.
 * A missing, truncated, foreign or mislabelled file is one line naming it (AB_EINVAL).
 *
 * Splits: "train" (the training file's images, less the last valid_rows; its first
 * train_rows of them when train_rows > 0), "valid" (only when valid_rows > 0: the last
 * valid_rows images of the training file, which training never sees), "test" (the test
 * file's images; its first test_rows when test_rows > 0).
 *
 * A row is one image as L = rows x cols x channels values in raster order (row by row,
 * left to right; for colour the R, G, B values of each pixel in turn): MNIST L = 784,
 * CIFAR-10 L = 3072. The values x_0 .. x_{L-1} in [0, 256) are predicted one by one
 * behind a start token (id 256):
 *     tokens  = 256 x_0 .. x_{L-2}     (N = L positions; input vocabulary 257)
 *     targets = x_0 .. x_{L-1}         (classes 256)
 * weight 1 everywhere, causal. Head: "categorical" (a softmax over the 256 values) or
 * "logistic_mixture" (`mixtures` discretised logistics; the model must have the head).
 * Metrics: bits_per_dim (the mean negative log-likelihood in nats / ln 2 over every
 * scored value) and, with the categorical head, accuracy (the fraction of values whose
 * most likely value is the right one).
 *
 * Generation: prompt k takes a test image (uniform, from the cursor) and a prefix
 * length p uniform in [0, L - 1]; the prompt is START x_0 .. x_{p-1}, the expected
 * continuation x_p .. x_{L-1}.
 *
 * Options: name; dataset ("mnist" | "fashion-mnist" | "cifar10", required); path
 * (required); head ("categorical" default | "logistic_mixture"); mixtures (default
 * 10, only with logistic_mixture); valid_rows (default 0: no valid split);
 * train_rows, test_rows (default 0: all); rows (split -> rows) and crc32 (file ->
 * CRC-32 of its images and labels: "train", "test"), written by the canonical config
 * and checked against the data when given, so that a resume on changed data is
 * refused. */
#ifndef AB_IMAGES_TASK_H
#define AB_IMAGES_TASK_H

#include "task.h"

extern const task_kind images_task_kind;

#endif
