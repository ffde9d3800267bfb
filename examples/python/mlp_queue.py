"""The Fashion-MNIST MLP of mlp.py fed from a shared RandomShuffleQueue on ps 0
(examples/mlp_queue.json in Python): the queue's enqueue_many is the job's
feeder, every training image once per epoch with its index as id; each
worker's replica dequeues batches of 64 from the same queue, and a batch
counts as consumed only once its step's gradient is applied, so every image
is learned exactly once per epoch, even when a worker dies. About 0.855 after
3 epochs. Needs Debian's dataset-fashion-mnist.

    dg up && PYTHONPATH=python python3 examples/python/mlp_queue.py
"""
import sys

import dg as tf

DATA = "/usr/share/datasets/fashion-mnist/"


def accuracy(prefix, logits, labels):
    pred = tf.argmax(logits, 1, output_type=tf.int32, name=prefix + "pred")
    correct = tf.equal(pred, labels, name=prefix + "correct")
    return tf.reduce_mean(tf.cast(correct, tf.float32), name=prefix + "accuracy")


def build():
    with tf.device("/job:ps/task:0"):
        train_x = tf.data.idx(DATA + "train-images-idx3-ubyte.gz", scale=True, flatten=True,
                              name="train_x")
        train_y = tf.data.idx(DATA + "train-labels-idx1-ubyte.gz", name="train_y")
        # image, label, and the example's id (component 2), which dg's feeder writes
        queue = tf.RandomShuffleQueue(8192, 2048, [tf.float32, tf.int32, tf.int64],
                                      shapes=[[784], [], []], seed=7, ids=2, name="examples")
        queue.enqueue_many([train_x, train_y], shuffle=True, seed=3, name="feed")
    # dequeue_up_to: the queue's last short batch is learned too
    images, labels, _ = queue.dequeue_up_to(64, name="batch")

    w1 = tf.Variable(tf.glorot_uniform_initializer(seed=1)([784, 256]), name="w1")
    b1 = tf.Variable(tf.zeros([256]), name="b1")
    w2 = tf.Variable(tf.glorot_uniform_initializer(seed=2)([256, 10]), name="w2")
    b2 = tf.Variable(tf.zeros([10]), name="b2")

    def logits_of(x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2

    logits = logits_of(images)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits), name="loss")
    train_accuracy = accuracy("", logits, labels)
    test_x = tf.data.idx(DATA + "t10k-images-idx3-ubyte.gz", scale=True, flatten=True,
                         name="test_x")
    test_y = tf.data.idx(DATA + "t10k-labels-idx1-ubyte.gz", name="test_y")
    test_accuracy = accuracy("test_", logits_of(test_x), test_y)
    train_op = tf.train.GradientDescentOptimizer(0.15).minimize(loss)
    return train_op, train_accuracy, test_accuracy


def main():
    train_op, accuracy, test_accuracy = build()
    job = dict(epochs=3, batch=64, metrics={"accuracy": accuracy},
               eval={"test_accuracy": test_accuracy}, eval_every_epochs=1,
               lr_schedule={"kind": "exponential", "every": 1407, "factor": 0.15})
    if "--json" in sys.argv[1:]:
        sys.stdout.write(tf.train.fit_json(train_op, **job))
        return
    result = tf.train.fit(train_op, **job)
    print("test_accuracy: %.4f" % result.evals["test_accuracy"])


if __name__ == "__main__":
    main()
