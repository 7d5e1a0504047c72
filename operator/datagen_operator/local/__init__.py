"""`datagen run`: a DataGenRun on one machine, with processes where the operator uses pods."""
