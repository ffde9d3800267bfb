# The seed's exercise 2: slices of unequal sizes (37 and 63), combined by
# overall_average = (size_1 * mean_1 + size_2 * mean_2) / total_size with
# tf.size; equal to numpy's mean of x. Also exercise 1: the job is not called
# "local" (nothing else changes). It starts its own two tasks (tf.train.Server)
# on ports 2224 and 2225.
import numpy as np
import dg as tf

cluster = tf.train.ClusterSpec({"averagers": ["localhost:2224", "localhost:2225"]})

x = tf.placeholder(tf.float32, 100)

with tf.device("/job:averagers/task:1"):
    first_batch = tf.slice(x, [0], [37])
    mean1 = tf.reduce_mean(first_batch)
    size1 = tf.cast(tf.size(first_batch), tf.float32)

with tf.device("/job:averagers/task:0"):
    second_batch = tf.slice(x, [37], [-1])
    mean2 = tf.reduce_mean(second_batch)
    size2 = tf.cast(tf.size(second_batch), tf.float32)
    mean = (size1 * mean1 + size2 * mean2) / tf.cast(tf.size(x), tf.float32)

servers = [tf.train.Server(cluster, job_name="averagers", task_index=i) for i in range(2)]

data = np.random.random(100)
with tf.Session("grpc://localhost:2224") as sess:
    result = sess.run(mean, feed_dict={x: data})
    print(result)
    print("numpy:", np.mean(data.astype(np.float32)))
