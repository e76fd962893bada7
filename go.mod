module github.com/meshfold/meshfold

go 1.26
