"""The Fashion-MNIST MLP of examples/mlp.json, written in Python (that file is
this program's --json output): 784-256-10, ReLU, softmax cross-entropy, SGD
lr 0.1, batch 64, 3 epochs, one replica per worker task, test accuracy after
every epoch (about 0.85 after 3). Needs Debian's dataset-fashion-mnist.

    dg up && PYTHONPATH=python python3 examples/python/mlp.py
    PYTHONPATH=python python3 examples/python/mlp.py --json > examples/mlp.json
"""
import sys

import dg as tf

DATA = "/usr/share/datasets/fashion-mnist/"
DOC = ("A 784-256-10 multilayer perceptron (ReLU, softmax cross-entropy) trained on "
       "Fashion-MNIST by SGD (lr 0.1, batch 64, 3 epochs), one replica per worker task, each "
       "on its shard of the 60000 training images; test accuracy over the 10000 test images "
       "after every epoch (about 0.85 after 3). Needs Debian's dataset-fashion-mnist. Run: dg "
       "up; dg submit examples/mlp.json. Written by examples/python/mlp.py --json.")


def model(prefix, images, w1, b1, w2, b2):
    """The logits; node names start with prefix."""
    h1 = tf.nn.relu(tf.add(tf.matmul(images, w1, name=prefix + "h1_mm"), b1,
                           name=prefix + "h1_pre"), name=prefix + "h1")
    return tf.add(tf.matmul(h1, w2, name=prefix + "logits_mm"), b2, name=prefix + "logits")


def accuracy(prefix, logits, labels):
    pred = tf.argmax(logits, 1, output_type=tf.int32, name=prefix + "pred")
    correct = tf.equal(pred, labels, name=prefix + "correct")
    return tf.reduce_mean(tf.cast(correct, tf.float32, name=prefix + "correct_f"),
                          name=prefix + "accuracy")


def build():
    train_x = tf.data.idx(DATA + "train-images-idx3-ubyte.gz", scale=True, flatten=True,
                          name="train_x")
    train_y = tf.data.idx(DATA + "train-labels-idx1-ubyte.gz", name="train_y")
    images, labels = tf.data.shard_batch(train_x, train_y, batch=64, seed=3, name="batch")

    w1 = tf.Variable(tf.glorot_uniform_initializer(seed=1)([784, 256]), name="w1")
    b1 = tf.Variable(tf.zeros([256]), name="b1")
    w2 = tf.Variable(tf.glorot_uniform_initializer(seed=2)([256, 10]), name="w2")
    b2 = tf.Variable(tf.zeros([10]), name="b2")

    logits = model("", images, w1, b1, w2, b2)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits,
                                                          name="xent")
    loss = tf.reduce_mean(xent, name="loss")
    train_accuracy = accuracy("", logits, labels)

    test_x = tf.data.idx(DATA + "t10k-images-idx3-ubyte.gz", scale=True, flatten=True,
                         name="test_x")
    test_y = tf.data.idx(DATA + "t10k-labels-idx1-ubyte.gz", name="test_y")
    test_accuracy = accuracy("test_", model("test_", test_x, w1, b1, w2, b2), test_y)

    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    return train_op, train_accuracy, test_accuracy


def main():
    train_op, accuracy, test_accuracy = build()
    job = dict(epochs=3, batch=64, metrics={"accuracy": accuracy},
               eval={"test_accuracy": test_accuracy}, eval_every_epochs=1)
    if "--json" in sys.argv[1:]:
        sys.stdout.write(tf.train.fit_json(train_op, doc=DOC, **job))
        return
    result = tf.train.fit(train_op, **job)
    print("test_accuracy: %.4f" % result.evals["test_accuracy"])


if __name__ == "__main__":
    main()
