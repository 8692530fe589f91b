/* What the files of the images suite share (test_images.c defines it): the scratch
 * folder and the binary the tests run, and the writers of the fixture files. */
#ifndef AB_TEST_IMAGES_H
#define AB_TEST_IMAGES_H

#include <criterion/criterion.h>

#include "checkpoint.h"
#include "error.h"
#include "image_data.h"
#include "task.h"
#include "task_list.h"
#include "npy.h"
#include "test_proc.h"
#include "test_run.h"
#include "train_config.h"
#include "trainer.h"
#include "transformer.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* This test's scratch folder, the last run's stdout and stderr, and the binary run
 * (attnbench, or attnbench-emu for --device cuda; the suite's teardown resets it). */
extern char g_dir[600];
extern char *g_out, *g_err;
extern const char *g_exe;

/* A path in the scratch folder (tp_path). */
#define P(...) tp_path(g_dir, __VA_ARGS__)

#define run(...) tp_wait(g_dir, tp_spawn(g_dir, g_exe, NULL, TP_ARGV("--threads", "1", __VA_ARGS__, NULL)), &g_out, &g_err)

/* An IDX file: magic 00 00 type ndim, big-endian dims, then `n` data bytes (which
 * need not match the dims: the tests write bad files too); gzip-compressed if gz. */
void write_idx(const char *path, int type, int ndim, const uint32_t *dims, const unsigned char *data, size_t n,
               bool gz);

/* The fixture's n images of rows x cols, whose values are known, and their labels
 * r mod 10 (malloc'ed). */
unsigned char *fixture_images(int n, int rows, int cols);
unsigned char *fixture_labels(int n);

/* The MNIST fixture's sizes: 4 x 4 images, 24 training (FX_VALID of them the task's valid
 * split) and 8 test images. */
enum { FX_SIDE = 4, FX_TRAIN = 24, FX_TEST = 8, FX_VALID = 4 };

/* A 4 x 4 "MNIST" folder: 24 training images (gzip-compressed files) and 8 test
 * images (plain files). */
void write_mnist_fixture(const char *dir);

#endif
