-- One database per organization's node (docker-compose.yml).
CREATE DATABASE IF NOT EXISTS defl_a CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS defl_b CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS defl_c CHARACTER SET utf8mb4;
