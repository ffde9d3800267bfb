# The seed's create_worker.py: start task N of the two-task cluster "local" and
# serve until stopped. Run "python3 create_worker.py 0" and
# "python3 create_worker.py 1" in two terminals (PYTHONPATH=python).
import sys
task_number = int(sys.argv[1])

import dg as tf

cluster = tf.train.ClusterSpec({"local": ["localhost:2222", "localhost:2223"]})
server = tf.train.Server(cluster, job_name="local", task_index=task_number)

print("Starting server #{}".format(task_number))

server.start()
server.join()
