"""ROS 2 interface glue: conversion between core types and ROS message field dicts."""
