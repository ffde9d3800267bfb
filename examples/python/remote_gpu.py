# The seed's exercise 3: a node on the GPU of task 0 ("/job:local/task:0/gpu:0").
# With soft placement it runs on task 0's CPU where the machine has no GPU,
# and log_device_placement prints where each node ran.
import dg as tf

cluster = tf.train.ClusterSpec({"local": ["localhost:2222", "localhost:2223"]})

x = tf.constant(2.0)

with tf.device("/job:local/task:0/gpu:0"):
    y1 = x + 300

with tf.device("/job:local/task:1"):
    y2 = x - 66

y = y1 + y2

config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=True)
with tf.Session("grpc://localhost:2222", config=config) as sess:
    result = sess.run(y)
    print(result)
